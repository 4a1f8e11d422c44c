//! The session machine's state as plain data (serde), so that a driver can keep a
//! session outside the process that serves one message of it: load it, feed one
//! message, store it again (a shared store such as Redis, behind several gateway
//! replicas).
//!
//! What a serialized [`Session`](crate::Session) holds: everything the machine
//! remembers between two inputs — lifecycle, negotiated revision, the peer's
//! `clientInfo` and capabilities, log level, subscriptions, requests in flight with
//! their rounds and live requests, retired ids, batches, counters, the learned
//! `x-mcp-header` table, and its id prefix. What it leaves out, on purpose:
//!
//! - the [`Config`](crate::Config) bounds and timings: they belong to the driver that
//!   feeds the next message (a session keeps only its `id_prefix`, so the ids it mints
//!   stay its own);
//! - the `server/discover` result: drivers share one copy between sessions
//!   ([`Session::discover`](crate::Session::discover)), so each session would
//!   otherwise carry its own;
//! - undrained events: serialize only after [`poll_event`](crate::Session::poll_event)
//!   returned `None` (events are what the driver must still do, not state).
//!
//! [`Session::restore`](crate::Session::restore) re-attaches the first two. The output
//! is deterministic (maps are written as key-sorted pairs), so one state always
//! serializes to the same bytes; unknown fields are ignored and missing ones take
//! their defaults, so a snapshot written by an older build still loads.
//!
//! Nothing here knows where snapshots are kept: no IO, no store.

use crate::jsonrpc::{Message, RequestId};
use crate::revision::Revision;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::HashMap;
use std::hash::Hash;

impl Serialize for RequestId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Number(n) => serializer.serialize_i64(*n),
            Self::String(s) => serializer.serialize_str(s),
        }
    }
}

impl<'de> Deserialize<'de> for RequestId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(deserializer)?;
        Self::from_value(&value)
            .ok_or_else(|| D::Error::custom("a request id must be a string or an integer"))
    }
}

impl Serialize for Message {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.to_value().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Message {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(deserializer)?;
        Self::from_value(value).map_err(|e| D::Error::custom(e.to_string()))
    }
}

/// A `HashMap` written as a list of `[key, value]` pairs sorted by key: JSON object
/// keys must be strings (request ids may be integers), and sorting makes the output
/// deterministic.
pub(crate) mod pairs {
    use super::*;

    pub(crate) fn serialize<K, V, H, S>(
        map: &HashMap<K, V, H>,
        serializer: S,
    ) -> Result<S::Ok, S::Error>
    where
        K: Serialize + Ord,
        V: Serialize,
        S: Serializer,
    {
        let mut entries: Vec<(&K, &V)> = map.iter().collect();
        entries.sort_by(|a, b| a.0.cmp(b.0));
        serializer.collect_seq(entries)
    }

    pub(crate) fn deserialize<'de, K, V, H, D>(
        deserializer: D,
    ) -> Result<HashMap<K, V, H>, D::Error>
    where
        K: Deserialize<'de> + Eq + Hash,
        V: Deserialize<'de>,
        H: std::hash::BuildHasher + Default,
        D: Deserializer<'de>,
    {
        let entries: Vec<(K, V)> = Vec::deserialize(deserializer)?;
        let len = entries.len();
        let map: HashMap<K, V, H> = entries.into_iter().collect();
        if map.len() != len {
            return Err(D::Error::custom("duplicate key in a serialized map"));
        }
        Ok(map)
    }
}

/// A `HashMap<String, V>` written as a key-sorted JSON object.
pub(crate) mod sorted {
    use super::*;
    use std::collections::BTreeMap;

    pub(crate) fn serialize<V, S>(
        map: &HashMap<String, V>,
        serializer: S,
    ) -> Result<S::Ok, S::Error>
    where
        V: Serialize,
        S: Serializer,
    {
        let sorted: BTreeMap<&String, &V> = map.iter().collect();
        sorted.serialize(serializer)
    }

    pub(crate) fn deserialize<'de, V, D>(deserializer: D) -> Result<HashMap<String, V>, D::Error>
    where
        V: Deserialize<'de>,
        D: Deserializer<'de>,
    {
        HashMap::deserialize(deserializer)
    }
}

/// The negotiated revision, written as its version string.
pub(crate) mod revision {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(
        revision: &Option<&'static Revision>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        revision.map(|r| r.version).serialize(serializer)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<&'static Revision>, D::Error> {
        match Option::<String>::deserialize(deserializer)? {
            None => Ok(None),
            Some(v) => Revision::lookup(&v)
                .map(Some)
                .ok_or_else(|| D::Error::custom(format!("unknown legacy revision {v:?}"))),
        }
    }
}
