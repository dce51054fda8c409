//! Sealed snapshots: AES-256-GCM around the whole state (ADR 0141 D3).
//!
//! The state is sealed inside a JSON envelope that the inner store keeps
//! as any state: `{"__loomEnc":"aes-256-gcm","kid":…,"iv":…,"ct":…}`.
//! The associated data binds the envelope to `execution_id|sequence`, so a
//! row's envelope moved to another (execution, sequence) fails to open.
//!
//! Compress BEFORE sealing: ciphertext does not compress, so a codec below
//! the seal saves only base64's overhead. With
//! [`EncryptingSnapshotStore::compressing`] the plaintext inside the
//! envelope is a frame (`0x01`/`0x02`, so the format byte is inside the GCM
//! tag and cannot be flipped unnoticed); opening takes either a frame or
//! the bare JSON text every earlier envelope holds, by the first byte.
//!
//! **The cost, stated:** the ciphertext's length then reveals the
//! COMPRESSED length of the state, the CRIME/BREACH family of leaks when a
//! party can both put text into the state (tool output, inbox text) next to
//! a secret and watch stored sizes (a database reader, a storage metric, a
//! backup listing) across re-saves. The state is the folded execution, not
//! one request, so the oracle is narrow, but real: compressing needs an
//! explicit [`LengthLeak::Accept`], and there is no way to construct a
//! compressing sealed store without one. Nor is there a codec without
//! sealing here (ADR 0141 refuses "codec without sealState"): this store
//! always seals the whole state, and a store that does not seal leaves
//! compression to its backend's own codec.

use std::collections::HashMap;

use aes_gcm::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use aes_gcm::{Aes256Gcm, Key, Nonce};
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use pgloom_core::frame::{self, Codec};

use super::{JsonText, NewSnapshot, Snapshot, SnapshotQuery, SnapshotStore};
use crate::Result;

/// The acknowledgment that compressing before sealing lets stored sizes
/// reveal the compressed length of states (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LengthLeak {
    /// Accepted: states are compressed inside the seal.
    Accept,
}

/// A sealing failure: no key for an envelope, or an envelope that does not
/// open (wrong key, moved to another execution or sequence, tampered).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SealError {
    /// The envelope names a key the ring does not hold.
    #[error("no key {0:?} in the key ring to open this snapshot")]
    UnknownKey(String),
    /// Authentication failed: the envelope was altered, or belongs to
    /// another (execution, sequence).
    #[error("sealed snapshot of {execution_id:?} at {sequence} does not authenticate: tampered, or moved from another execution or sequence")]
    Authentication {
        /// Where it was read.
        execution_id: String,
        /// At which sequence.
        sequence: i64,
    },
    /// The stored state is not an envelope this loom writes.
    #[error("snapshot state is not a sealed envelope: {0}")]
    NotAnEnvelope(&'static str),
    /// A key ring that does not parse.
    #[error("invalid key ring: {0}")]
    InvalidKeyRing(&'static str),
}

/// AES-256 keys by id; one of them seals, all of them open.
#[derive(Clone)]
pub struct KeyRing {
    current: String,
    keys: HashMap<String, Key<Aes256Gcm>>,
}

impl std::fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut ids: Vec<&String> = self.keys.keys().collect();
        ids.sort();
        f.debug_struct("KeyRing")
            .field("current", &self.current)
            .field("keys", &ids)
            .finish()
    }
}

impl KeyRing {
    /// A ring that seals with `current` (32 bytes) under id `kid`.
    #[must_use]
    pub fn new(kid: impl Into<String>, current: [u8; 32]) -> Self {
        let kid = kid.into();
        let mut keys = HashMap::new();
        keys.insert(kid.clone(), Key::<Aes256Gcm>::from(current));
        KeyRing { current: kid, keys }
    }

    /// Adds a key that opens (older) envelopes.
    #[must_use]
    pub fn with_key(mut self, kid: impl Into<String>, key: [u8; 32]) -> Self {
        self.keys.insert(kid.into(), Key::<Aes256Gcm>::from(key));
        self
    }

    /// Parses `{"current":"k2","keys":{"k1":"<base64 of 32 bytes>","k2":"…"}}`,
    /// the form a key file or the `LOOM_KEYRING` variable holds.
    ///
    /// # Errors
    ///
    /// [`SealError::InvalidKeyRing`] naming what is wrong.
    pub fn from_json(text: &str) -> Result<Self, SealError> {
        let invalid = SealError::InvalidKeyRing;
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|_| invalid("not JSON"))?;
        let current = value["current"]
            .as_str()
            .ok_or(invalid("no \"current\" key id"))?;
        let entries = value["keys"]
            .as_object()
            .ok_or(invalid("no \"keys\" object"))?;
        let mut keys = HashMap::new();
        for (kid, encoded) in entries {
            let bytes = BASE64
                .decode(encoded.as_str().ok_or(invalid("a key is not a string"))?)
                .map_err(|_| invalid("a key is not base64"))?;
            let key: [u8; 32] = bytes
                .try_into()
                .map_err(|_| invalid("a key is not 32 bytes"))?;
            keys.insert(kid.clone(), Key::<Aes256Gcm>::from(key));
        }
        if !keys.contains_key(current) {
            return Err(invalid("\"current\" names no key"));
        }
        Ok(KeyRing {
            current: current.to_owned(),
            keys,
        })
    }
}

/// The marker an envelope's `__loomEnc` carries.
const CIPHER: &str = "aes-256-gcm";

/// Whether a stored state is a sealed envelope: a JSON object whose
/// `__loomEnc` member is `"aes-256-gcm"`. Judged on the parsed JSON, not
/// the text: a JSONB column gives the members back in its own order, and
/// a key may be written with escapes.
///
/// ```
/// use pgloom::snapshot_store::is_sealed;
/// assert!(is_sealed(r#"{"ct":"AAAA","__loomEnc":"aes-256-gcm","iv":"x","kid":"k"}"#));
/// assert!(is_sealed(r#"{"__loom\u0045nc": "aes-256-gcm"}"#));
/// assert!(!is_sealed(r#"{"state":{"__loomEnc":"aes-256-gcm"}}"#));
/// assert!(!is_sealed("[1,2]"));
/// ```
#[must_use]
pub fn is_sealed(state: &str) -> bool {
    use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};

    struct Envelope;
    impl<'de> Visitor<'de> for Envelope {
        type Value = bool;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
            let mut sealed = false;
            while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                if key == "__loomEnc" {
                    let value: serde_json::Value = map.next_value()?;
                    sealed = value == CIPHER;
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(sealed)
        }
    }
    // Anything but an object is an error of the visitor: not sealed.
    let mut de = serde_json::Deserializer::from_str(state);
    de.deserialize_any(Envelope).unwrap_or(false)
}

/// A [`SnapshotStore`] that seals whole states in its inner store.
#[derive(Debug)]
pub struct EncryptingSnapshotStore<S> {
    inner: S,
    keys: KeyRing,
    codec: Codec,
}

impl<S: SnapshotStore> EncryptingSnapshotStore<S> {
    /// Seals the state's JSON text as it is: the envelope's length reveals
    /// only the state's own length.
    pub fn new(inner: S, keys: KeyRing) -> Self {
        EncryptingSnapshotStore {
            inner,
            keys,
            codec: Codec::None,
        }
    }

    /// Compresses each state (zstd) before sealing it, for envelopes
    /// several times smaller, at the cost [`LengthLeak`] names.
    ///
    /// # Errors
    ///
    /// [`crate::Error::CodecUnavailable`] in a build without zstd.
    pub fn compressing(inner: S, keys: KeyRing, _acknowledged: LengthLeak) -> Result<Self> {
        super::check_codec(Codec::Zstd)?;
        Ok(EncryptingSnapshotStore {
            inner,
            keys,
            codec: Codec::Zstd,
        })
    }

    /// The inner store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    fn aad(execution_id: &str, sequence: i64) -> Vec<u8> {
        format!("{execution_id}|{sequence}").into_bytes()
    }

    fn seal(&self, snapshot: &NewSnapshot) -> Result<JsonText> {
        let plaintext = match self.codec {
            Codec::None => snapshot.state.as_str().as_bytes().to_vec(),
            // Its own codec is never Delta: a delta of ciphertext saves
            // nothing (an inner delta store, given sealed envelopes, finds
            // each delta too large and writes keyframes).
            Codec::Zstd | Codec::Delta => frame::encode(snapshot.state.as_str(), Codec::Zstd)?,
        };
        let cipher = Aes256Gcm::new(&self.keys.keys[&self.keys.current]);
        let nonce = Aes256Gcm::generate_nonce(&mut OsRng);
        let aad = Self::aad(&snapshot.execution_id, snapshot.sequence);
        let ciphertext = cipher
            .encrypt(
                &nonce,
                Payload {
                    msg: &plaintext,
                    aad: &aad,
                },
            )
            .expect("AES-GCM seals any plaintext under 64 GiB");
        let envelope = serde_json::json!({
            "__loomEnc": CIPHER,
            "kid": self.keys.current,
            "iv": BASE64.encode(nonce),
            "ct": BASE64.encode(ciphertext),
        });
        Ok(JsonText::new(envelope.to_string())?)
    }

    fn open(&self, mut snapshot: Snapshot) -> Result<Snapshot> {
        let envelope: serde_json::Value = serde_json::from_str(snapshot.state.as_str())
            .map_err(|_| SealError::NotAnEnvelope("not a JSON object"))?;
        if envelope["__loomEnc"] != CIPHER {
            return Err(SealError::NotAnEnvelope("no \"__loomEnc\": \"aes-256-gcm\"").into());
        }
        let field = |name: &'static str| {
            envelope[name]
                .as_str()
                .ok_or(SealError::NotAnEnvelope(name))
        };
        let kid = field("kid")?;
        let key = self
            .keys
            .keys
            .get(kid)
            .ok_or_else(|| SealError::UnknownKey(kid.to_owned()))?;
        let iv = BASE64
            .decode(field("iv")?)
            .map_err(|_| SealError::NotAnEnvelope("iv"))?;
        let ct = BASE64
            .decode(field("ct")?)
            .map_err(|_| SealError::NotAnEnvelope("ct"))?;
        if iv.len() != 12 {
            return Err(SealError::NotAnEnvelope("iv").into());
        }
        let aad = Self::aad(&snapshot.execution_id, snapshot.sequence);
        let plaintext = Aes256Gcm::new(key)
            .decrypt(
                Nonce::from_slice(&iv),
                Payload {
                    msg: &ct,
                    aad: &aad,
                },
            )
            .map_err(|_| SealError::Authentication {
                execution_id: snapshot.execution_id.clone(),
                sequence: snapshot.sequence,
            })?;
        // A frame by its format byte (a control character), else the bare
        // JSON text every earlier envelope holds.
        snapshot.state = match plaintext.first() {
            Some(byte) if *byte < 0x20 && !b"\t\r\n".contains(byte) => {
                JsonText::from(frame::decode_json(&plaintext)?)
            }
            _ => JsonText::from(frame::decode_bare(plaintext)?),
        };
        Ok(snapshot)
    }

    /// The latest snapshot as stored, still sealed (for archiving or
    /// re-keying without opening it).
    ///
    /// # Errors
    ///
    /// What the inner store returns.
    pub async fn load_latest_sealed(&self, execution_id: &str) -> Result<Option<Snapshot>> {
        self.inner.load_latest(execution_id).await
    }
}

impl<S: SnapshotStore> SnapshotStore for EncryptingSnapshotStore<S> {
    fn snapshot_codec(&self) -> Codec {
        // The codec that shapes what is stored: ours when we compress,
        // else whatever the inner store applies to the envelope.
        match self.codec {
            Codec::Zstd | Codec::Delta => Codec::Zstd,
            Codec::None => self.inner.snapshot_codec(),
        }
    }

    fn id_scope(&self) -> crate::id_scope::IdScope {
        self.inner.id_scope()
    }

    fn seals_whole_state(&self) -> bool {
        true
    }

    async fn save(&self, snapshot: &NewSnapshot) -> Result<i64> {
        let sealed = NewSnapshot {
            state: self.seal(snapshot)?,
            ..snapshot.clone()
        };
        self.inner.save(&sealed).await
    }

    async fn load(&self, execution_id: &str, query: SnapshotQuery) -> Result<Option<Snapshot>> {
        self.inner
            .load(execution_id, query)
            .await?
            .map(|s| self.open(s))
            .transpose()
    }
    async fn delete_snapshots(&self, execution_id: &str, limit: usize) -> Result<u64> {
        self.inner.delete_snapshots(execution_id, limit).await
    }

    async fn latest_sequence(&self, execution_id: &str) -> Result<Option<i64>> {
        self.inner.latest_sequence(execution_id).await
    }
}
