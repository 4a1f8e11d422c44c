//! The host requests of the bridge waiting for their answers, by principal and
//! JSON-RPC id: what a host's `notifications/cancelled` names. 2026-07-28
//! `basic/patterns/cancellation`: over Streamable HTTP closing the request's stream
//! is the cancellation and no notification is expected, but a host may still POST
//! one (as it must on stdio); the bridge honours it the same way.

use super::partition::Command;
use dualera_adapters::jsonrpc::RequestId;
use dualera_adapters::reverse::HostKey;
use std::collections::HashMap;
use std::sync::Mutex;
use tokio::sync::mpsc;

/// One waiting host request.
struct Entry {
    host: HostKey,
    commands: mpsc::Sender<Command>,
}

/// (principal, the host's JSON-RPC id as JSON text) → the requests waiting under it.
/// Every entry belongs to a request being served (removed when its handler ends), so
/// the map is as bounded as the connections are.
#[derive(Default)]
pub(super) struct InFlight {
    map: Mutex<HashMap<(String, String), Vec<Entry>>>,
}

impl InFlight {
    fn key(principal: &str, id: &RequestId) -> (String, String) {
        (principal.to_owned(), id.to_value().to_string())
    }

    /// Notes that `host` (the principal's request `id`) waits.
    pub(super) fn insert(
        &self,
        principal: &str,
        id: &RequestId,
        host: HostKey,
        commands: mpsc::Sender<Command>,
    ) {
        if let Ok(mut m) = self.map.lock() {
            m.entry(Self::key(principal, id))
                .or_default()
                .push(Entry { host, commands });
        }
    }

    /// `host` no longer waits.
    pub(super) fn remove(&self, principal: &str, id: &RequestId, host: HostKey) {
        let key = Self::key(principal, id);
        if let Ok(mut m) = self.map.lock() {
            if let Some(entries) = m.get_mut(&key) {
                entries.retain(|e| e.host != host);
                if entries.is_empty() {
                    m.remove(&key);
                }
            }
        }
    }

    /// A host of `principal` cancelled its request `id`: that request's call is
    /// cancelled upstream as if its stream had closed. Ignored (2026-07-28
    /// `basic/patterns/cancellation`, "Error Handling": invalid cancellations SHOULD
    /// be ignored) when no request of the principal has that id, and when several
    /// have (hosts sharing a principal may reuse ids; cancelling the wrong one is
    /// worse than cancelling none). `true`: a request was cancelled.
    pub(super) fn cancel(&self, principal: &str, id: &RequestId) -> bool {
        let Ok(m) = self.map.lock() else {
            return false;
        };
        match m.get(&Self::key(principal, id)).map(Vec::as_slice) {
            Some([only]) => only.commands.try_send(Command::Gone(only.host)).is_ok(),
            _ => false,
        }
    }

    /// Requests waiting.
    pub(super) fn len(&self) -> usize {
        self.map
            .lock()
            .map_or(0, |m| m.values().map(Vec::len).sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_cancellation_reaches_the_one_request_it_names_and_no_other() {
        let inflight = InFlight::default();
        let (tx, mut rx) = mpsc::channel(4);
        let id = RequestId::Number(7);
        inflight.insert("alice", &id, HostKey(1), tx.clone());
        // Another principal's request of the same id is not the same request.
        assert!(!inflight.cancel("bob", &id));
        assert!(!inflight.cancel("alice", &RequestId::Number(8)));
        assert!(inflight.cancel("alice", &id));
        assert!(matches!(rx.try_recv(), Ok(Command::Gone(HostKey(1)))));
        // Two waiting requests of one principal with one id: ambiguous, ignored.
        inflight.insert("alice", &id, HostKey(2), tx);
        assert!(!inflight.cancel("alice", &id));
        assert!(rx.try_recv().is_err());
        inflight.remove("alice", &id, HostKey(1));
        inflight.remove("alice", &id, HostKey(2));
        assert_eq!(inflight.len(), 0);
        assert!(!inflight.cancel("alice", &id));
    }
}
