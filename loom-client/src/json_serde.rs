//! `serde` for loom's exact JSON texts ([`crate::event_store::Payload`],
//! [`crate::snapshot_store::JsonText`]), feature `serde`: written into a
//! JSON document as the JSON they are, byte for byte (serde_json's raw
//! value), not as a string of it, and read back the same way, so that an
//! event or a snapshot goes through a queue or an API as itself.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;

/// Writes `text` as the JSON value it is.
pub(crate) fn serialize<S: Serializer>(text: &str, serializer: S) -> Result<S::Ok, S::Error> {
    // A text loom holds is one JSON text; serde_json re-checks it, and
    // refuses (an error, not a panic) the few a store never returns: a
    // string with an escaped lone surrogate.
    RawValue::from_string(text.to_owned())
        .map_err(serde::ser::Error::custom)?
        .serialize(serializer)
}

/// Reads one JSON value as its exact text, checked by `check`.
pub(crate) fn deserialize<'de, D, T, E>(
    deserializer: D,
    check: impl FnOnce(String) -> Result<T, E>,
) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    E: std::fmt::Display,
{
    let raw = Box::<RawValue>::deserialize(deserializer)?;
    check(raw.get().to_owned()).map_err(D::Error::custom)
}

#[cfg(test)]
mod tests {
    use crate::branch_registry::BranchRef;
    use crate::event_store::{Event, Payload};
    use crate::snapshot_store::{JsonText, NewSnapshot, Snapshot};

    /// What JSONB or a `serde_json::Value` would change: key order,
    /// duplicate keys, numbers past f64, escapes kept as written.
    const EXACT: &str = r#"{"z":1,"a":[1.0,1e400,-0.0],"a":"dup","__proto__":{"x":"\u00e9\/"}}"#;

    #[test]
    fn an_event_and_a_snapshot_go_through_json_byte_for_byte() {
        let mut event = Event::new("run-1", 7, "step", Payload::new(EXACT).unwrap());
        event.metadata = Some(Payload::new(r#"{"trace":"4bf9"}"#).unwrap());
        let json = serde_json::to_string(&event).unwrap();
        assert!(json.contains(&format!(r#""payload":{EXACT}"#)), "{json}");
        let back: Event = serde_json::from_str(&json).unwrap();
        assert_eq!(back.payload.as_str(), EXACT);
        assert_eq!(
            back.metadata.as_ref().map(Payload::as_str),
            Some(r#"{"trace":"4bf9"}"#)
        );
        assert_eq!(back, event);

        let state = JsonText::new(EXACT.to_owned()).unwrap();
        let snapshot = Snapshot::new(
            3,
            NewSnapshot::new("run-1", "agent", 7, state),
            std::time::SystemTime::UNIX_EPOCH,
        );
        let json = serde_json::to_string(&snapshot).unwrap();
        let back: Snapshot = serde_json::from_str(&json).unwrap();
        assert_eq!(back.state.as_str(), EXACT);
        assert_eq!(back, snapshot);

        let branch: BranchRef =
            serde_json::from_str(r#"{"name":"main","execution_id":"run-1","sequence":7}"#).unwrap();
        assert_eq!(branch.sequence, 7);
    }

    #[test]
    fn what_is_not_json_is_refused_not_taken() {
        // A payload that is a string holding JSON stays a string.
        let event: Event = serde_json::from_str(
            r#"{"execution_id":"r","sequence":1,"kind":"k","payload":"{\"a\":1}","created_at":null,"metadata":null}"#,
        )
        .unwrap();
        assert_eq!(event.payload.as_str(), r#""{\"a\":1}""#);
        assert!(serde_json::from_str::<Event>(r#"{"execution_id":"r","sequence":1,"kind":"k","payload":{oops},"created_at":null,"metadata":null}"#).is_err());
    }
}
