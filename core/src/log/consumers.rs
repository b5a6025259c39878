//! Consumers: committed offsets by name, created by their first commit, deleted, and
//! persisted in the journal.

use super::Log;
use super::format::MAX_CONSUMER_NAME_LEN;
use super::journal::{Consumer, MAX_CONSUMERS};
use crate::error::CommitError;
use crate::storage::Flash;

/// Name of the consumer registered at format time.
pub const BRIDGE_CONSUMER: &str = "bridge";

pub(super) fn check_name<E: core::fmt::Debug>(name: &str) -> Result<(), CommitError<E>> {
    if name.is_empty() || name.len() > MAX_CONSUMER_NAME_LEN {
        return Err(CommitError::BadName { len: name.len() });
    }
    Ok(())
}

impl<'a, F: Flash> Log<'a, F> {
    /// Commits `offset` for `consumer`: every offset below it is done. A consumer is created
    /// by its first commit (up to [`MAX_CONSUMERS`]); a commit that would go backwards
    /// changes nothing. Returns the consumer's committed offset after the call. The commit
    /// is persisted by [`Log::tick`] after `commit_interval_us`, by [`Log::persist`], or
    /// before a segment it frees is reused.
    ///
    /// Errors: [`CommitError::OffsetOutOfRange`] above the next offset,
    /// [`CommitError::BadName`], [`CommitError::TooManyConsumers`],
    /// [`CommitError::Poisoned`] once a flash write, erase or sync has failed.
    pub fn commit(&mut self, consumer: &str, offset: u64) -> Result<u64, CommitError<F::Error>> {
        if let Some(op) = self.dev.failed {
            return Err(CommitError::Poisoned { op });
        }
        check_name(consumer)?;
        if offset > self.next_offset {
            return Err(CommitError::OffsetOutOfRange {
                offset,
                next: self.next_offset,
            });
        }
        if let Some(c) = self.consumers.iter_mut().find(|c| c.name == consumer) {
            if offset > c.committed {
                c.committed = offset;
                self.dirty = true;
            }
            return Ok(c.committed);
        }
        let mut name = heapless::String::new();
        let _ = name.push_str(consumer);
        let persisted = offset.min(self.durable_end);
        self.consumers
            .push(Consumer {
                name,
                committed: offset,
                persisted,
            })
            .map_err(|_| CommitError::TooManyConsumers { max: MAX_CONSUMERS })?;
        self.dirty = true;
        Ok(offset)
    }

    /// The committed offset of `consumer`, if it exists.
    pub fn committed(&self, consumer: &str) -> Option<u64> {
        self.consumers
            .iter()
            .find(|c| c.name == consumer)
            .map(|c| c.committed)
    }

    /// Consumers and their committed offsets.
    pub fn consumers(&self) -> impl Iterator<Item = (&str, u64)> + '_ {
        self.consumers
            .iter()
            .map(|c| (c.name.as_str(), c.committed))
    }

    /// Deletes a consumer (persisted at once); returns whether it existed.
    ///
    /// Errors: [`CommitError::Poisoned`] once a flash write, erase or sync has failed,
    /// storage errors (the first failure).
    pub fn delete_consumer(&mut self, consumer: &str) -> Result<bool, CommitError<F::Error>> {
        if let Some(op) = self.dev.failed {
            return Err(CommitError::Poisoned { op });
        }
        let Some(i) = self.consumers.iter().position(|c| c.name == consumer) else {
            return Ok(false);
        };
        let gone = self.consumers.remove(i);
        self.released = self.released.max(gone.committed);
        self.persist_journal(false)?;
        Ok(true)
    }

    /// Persists committed offsets now (one journal write and a sync).
    ///
    /// Errors: [`CommitError::Poisoned`] once a flash write, erase or sync has failed,
    /// storage errors (the first failure).
    pub fn persist(&mut self, now_us: u64) -> Result<(), CommitError<F::Error>> {
        self.now_us = now_us;
        if let Some(op) = self.dev.failed {
            return Err(CommitError::Poisoned { op });
        }
        self.persist_journal(false)?;
        Ok(())
    }
}
