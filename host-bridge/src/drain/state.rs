//! What the drains of one process share: the state file (one redb handle, reopened once
//! for all of them after a failed transaction) and the gateway ids announced so far (two
//! gateways announcing the same id are refused).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::checkpoint::{Store, StoreError};

/// The state file shared by every drain of the process. Each drain takes the current
/// handle for each transaction ([`SharedStore::current`]) with its generation; after a
/// failed transaction it asks for a reopen of that generation ([`SharedStore::reopen`]),
/// which the first drain to ask performs and the others find already done.
#[derive(Debug)]
pub struct SharedStore {
    path: PathBuf,
    /// (generation, handle): the generation counts successful reopens.
    slot: Mutex<(u64, Store)>,
    /// Held while a reopen runs, so that drains reopen one at a time.
    reopening: smol::lock::Mutex<()>,
}

impl SharedStore {
    /// Opens (or creates) the state file at `path`.
    ///
    /// # Errors
    /// The state file cannot be opened ([`StoreError`]).
    pub async fn open(path: &Path) -> Result<Arc<SharedStore>, StoreError> {
        let store = Store::open_async(path).await?;
        Ok(Arc::new(SharedStore {
            path: path.to_path_buf(),
            slot: Mutex::new((0, store)),
            reopening: smol::lock::Mutex::new(()),
        }))
    }

    /// As [`SharedStore::open`], with the error a drain reports
    /// ([`DrainError::StateOpen`](super::DrainError::StateOpen), naming `path`).
    pub(super) async fn open_for_drain(path: &Path) -> Result<Arc<SharedStore>, super::DrainError> {
        SharedStore::open(path)
            .await
            .map_err(|source| super::DrainError::StateOpen {
                path: path.to_path_buf(),
                source,
            })
    }

    /// The state file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The current handle and its generation (a closed handle while a reopen failed).
    pub fn current(&self) -> (u64, Store) {
        match self.slot.lock() {
            Ok(s) => (s.0, s.1.clone()),
            Err(_) => (u64::MAX, Store::closed()),
        }
    }

    /// Reopens the state file after a transaction on the handle of generation `seen`
    /// failed: a no-op when another drain has already reopened it since. The old handle
    /// is released first; the file opens only once no transaction of any drain still holds
    /// it, so a failure here is retried by the caller.
    ///
    /// # Errors
    /// Opening the file failed; the handle stays closed until a reopen succeeds.
    pub async fn reopen(&self, seen: u64) -> Result<(), StoreError> {
        let _one_at_a_time = self.reopening.lock().await;
        {
            let mut s = self.slot.lock().map_err(|_| StoreError::Closed)?;
            if s.0 != seen {
                return Ok(());
            }
            s.1 = Store::closed();
        }
        let store = Store::open_async(&self.path).await?;
        let mut s = self.slot.lock().map_err(|_| StoreError::Closed)?;
        s.0 = seen.wrapping_add(1);
        s.1 = store;
        Ok(())
    }
}

/// Gateway ids announced by the gateways of one drain process, with the URI of the gateway
/// that announced each.
#[derive(Debug, Default)]
pub struct GatewayIds(Mutex<HashMap<String, String>>);

impl GatewayIds {
    /// Records that the gateway at `uri` announced `id` (dropping what it announced before).
    /// Returns the URI of another gateway that announced the same id, if any (the claim is
    /// then not recorded).
    pub fn claim(&self, id: &str, uri: &str) -> Option<String> {
        let Ok(mut m) = self.0.lock() else {
            return None;
        };
        if let Some(other) = m.get(id)
            && other != uri
        {
            return Some(other.clone());
        }
        m.retain(|_, u| u != uri);
        m.insert(id.to_string(), uri.to_string());
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reopen_is_done_once_for_every_drain_that_saw_the_failure() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.redb");
        smol::block_on(async {
            let s = SharedStore::open(&p).await.unwrap();
            let (g, _) = s.current();
            s.reopen(g).await.unwrap();
            let (g2, st) = s.current();
            assert_eq!(g2, g + 1);
            // A second drain that saw the same failure finds it done.
            s.reopen(g).await.unwrap();
            assert_eq!(s.current().0, g2);
            drop(st);
        });
    }

    #[test]
    fn a_gateway_id_is_claimed_by_one_uri() {
        let ids = GatewayIds::default();
        assert_eq!(ids.claim("gw-1", "tcp://a:1"), None);
        assert_eq!(ids.claim("gw-1", "tcp://a:1"), None);
        assert_eq!(ids.claim("gw-1", "tcp://b:1"), Some("tcp://a:1".into()));
        // a:1 reflashed under a new name frees the old one.
        assert_eq!(ids.claim("gw-2", "tcp://a:1"), None);
        assert_eq!(ids.claim("gw-1", "tcp://b:1"), None);
    }
}
