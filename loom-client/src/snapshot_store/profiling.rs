//! Size and latency histograms of any snapshot store (ADR 0141 D8).
//!
//! By default it measures what is on disk: the frame's bytes over a zstd
//! store, the JSON text's otherwise. Never stored bytes over a store that
//! seals whole states: a compressed envelope's size is the CRIME/BREACH
//! oracle ADR 0141 D3 accepts only knowingly, and metrics are read by
//! people who were never asked. Asking for it there is an error. (A
//! profiler placed BELOW a sealing store sees only envelopes and cannot
//! tell: do not show that placement's sizes to untrusted readers.)

use std::sync::Mutex;
use std::time::Instant;

use pgloom_core::frame::{self, Codec};

use super::{NewSnapshot, Snapshot, SnapshotQuery, SnapshotStore};
use crate::{Error, Result};

/// What a profiler's size histogram counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Measure {
    /// Stored bytes where allowed and different, else JSON bytes.
    Auto,
    /// The bytes the store writes (the frame over a zstd store).
    Stored,
    /// The state's JSON text.
    Json,
}

/// Percentiles of one series.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Histogram {
    /// How many values.
    pub count: usize,
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// Largest.
    pub max: u64,
}

impl Histogram {
    fn of(values: &[u64]) -> Self {
        let mut sorted = values.to_vec();
        sorted.sort_unstable();
        let at = |q: f64| {
            sorted
                .get(((sorted.len() as f64 - 1.0) * q).round() as usize)
                .copied()
                .unwrap_or(0)
        };
        Histogram {
            count: sorted.len(),
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
            max: sorted.last().copied().unwrap_or(0),
        }
    }
}

/// What a [`ProfilingSnapshotStore`] saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    /// What `sizes` counts: [`Measure::Stored`] or [`Measure::Json`].
    pub measured: Measure,
    /// Bytes per saved state.
    pub sizes: Histogram,
    /// Microseconds per save.
    pub save_micros: Histogram,
    /// Microseconds per load (any of the three).
    pub load_micros: Histogram,
}

#[derive(Debug, Default)]
struct Series {
    sizes: Vec<u64>,
    saves: Vec<u64>,
    loads: Vec<u64>,
}

/// A [`SnapshotStore`] that records what passes through it.
#[derive(Debug)]
pub struct ProfilingSnapshotStore<S> {
    inner: S,
    measured: Measure,
    series: Mutex<Series>,
}

impl<S: SnapshotStore> ProfilingSnapshotStore<S> {
    /// Profiles `inner`, measuring sizes as `measure` says.
    ///
    /// # Errors
    ///
    /// [`Error::Profiling`] for [`Measure::Stored`] over a store that seals
    /// whole states.
    pub fn new(inner: S, measure: Measure) -> Result<Self> {
        let measured = match (measure, inner.seals_whole_state(), inner.snapshot_codec()) {
            (Measure::Stored, true, _) => {
                return Err(Error::Profiling(
                    "a profiler over a store that seals whole states must not report stored sizes: they leak compressed lengths",
                ))
            }
            (Measure::Auto, false, Codec::Zstd) | (Measure::Stored, false, _) => Measure::Stored,
            _ => Measure::Json,
        };
        Ok(ProfilingSnapshotStore {
            inner,
            measured,
            series: Mutex::default(),
        })
    }

    /// The histograms so far.
    pub fn profile(&self) -> Profile {
        let series = self.series.lock().expect("never poisoned");
        Profile {
            measured: self.measured,
            sizes: Histogram::of(&series.sizes),
            save_micros: Histogram::of(&series.saves),
            load_micros: Histogram::of(&series.loads),
        }
    }

    fn size_of(&self, snapshot: &NewSnapshot) -> u64 {
        let json = snapshot.state.as_str();
        let bytes = match (self.measured, self.inner.snapshot_codec()) {
            (Measure::Stored, Codec::Zstd) => {
                frame::encode(json, Codec::Zstd).map_or(json.len() + 1, |f| f.len())
            }
            _ => json.len(),
        };
        bytes as u64
    }

    async fn timed_load(
        &self,
        load: impl std::future::Future<Output = Result<Option<Snapshot>>>,
    ) -> Result<Option<Snapshot>> {
        let started = Instant::now();
        let loaded = load.await;
        let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.series
            .lock()
            .expect("never poisoned")
            .loads
            .push(micros);
        loaded
    }
}

impl<S: SnapshotStore> SnapshotStore for ProfilingSnapshotStore<S> {
    fn snapshot_codec(&self) -> Codec {
        self.inner.snapshot_codec()
    }

    fn id_scope(&self) -> crate::id_scope::IdScope {
        self.inner.id_scope()
    }

    fn seals_whole_state(&self) -> bool {
        self.inner.seals_whole_state()
    }

    async fn save(&self, snapshot: &NewSnapshot) -> Result<i64> {
        let size = self.size_of(snapshot);
        let started = Instant::now();
        let saved = self.inner.save(snapshot).await;
        let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        let mut series = self.series.lock().expect("never poisoned");
        series.saves.push(micros);
        series.sizes.push(size);
        saved
    }

    async fn load(&self, execution_id: &str, query: SnapshotQuery) -> Result<Option<Snapshot>> {
        self.timed_load(self.inner.load(execution_id, query)).await
    }
    async fn delete_snapshots(&self, execution_id: &str, limit: usize) -> Result<u64> {
        self.inner.delete_snapshots(execution_id, limit).await
    }

    async fn latest_sequence(&self, execution_id: &str) -> Result<Option<i64>> {
        self.inner.latest_sequence(execution_id).await
    }
}
