//! The relay's claims in flight: claimed, not yet settled or released.
//!
//! The relay, not the store, remembers them. Each claim passes the list to the store
//! ([`crate::store::ClaimParams::in_flight`]), so a store that leases no rows (PostgreSQL's
//! ordered claims) can keep this relay's next claim off the aggregates it is still sending.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::store::{Claim, Fence};

/// Claims in flight, shared by the main loop and the batches' tasks.
#[derive(Debug, Default)]
pub(super) struct InFlight {
    claims: Mutex<Slots>,
    /// Poked when a claim in flight started settling ([`Held::acknowledged`]): the main loop,
    /// waiting for a batch, may claim again.
    pub(super) acknowledged: tokio::sync::Notify,
    /// Set when a claim that started settling freed aggregates: a claim ahead may find their
    /// next events even after one came back short.
    freed: std::sync::atomic::AtomicBool,
}

#[derive(Debug, Default)]
struct Slots {
    next: u64,
    by_slot: HashMap<u64, Slot>,
}

#[derive(Debug)]
struct Slot {
    /// The claim as the next claim must see it (after its acknowledgement, the claim that
    /// stands for it: [`Claim::acknowledged`]).
    claim: Arc<Claim>,
    /// Its payload bytes, held in memory until it is settled or released.
    bytes: u64,
    /// Its events were published: it is settling ([`Held::acknowledged`]).
    settling: bool,
}

impl InFlight {
    /// The claims in flight now.
    pub(super) fn snapshot(&self) -> Vec<Arc<Claim>> {
        let s = self.claims.lock().unwrap_or_else(|p| p.into_inner());
        s.by_slot.values().map(|slot| slot.claim.clone()).collect()
    }

    /// The payload bytes of the claims in flight now.
    pub(super) fn bytes(&self) -> u64 {
        let s = self.claims.lock().unwrap_or_else(|p| p.into_inner());
        s.by_slot.values().map(|slot| slot.bytes).sum()
    }

    /// Did a claim that started settling free aggregates since the last call?
    pub(super) fn take_freed(&self) -> bool {
        self.freed.swap(false, std::sync::atomic::Ordering::SeqCst)
    }

    /// The claims in flight not settling ([`Held::acknowledged`]).
    pub(super) fn publishing(&self) -> usize {
        let s = self.claims.lock().unwrap_or_else(|p| p.into_inner());
        s.by_slot.values().filter(|slot| !slot.settling).count()
    }

    /// Remember `claim` until the returned guard is dropped (after its settle or release).
    pub(super) fn hold(self: &Arc<Self>, claim: Arc<Claim>) -> Held {
        let mut s = self.claims.lock().unwrap_or_else(|p| p.into_inner());
        let slot = s.next;
        s.next += 1;
        let bytes = claim_bytes(&claim);
        s.by_slot.insert(
            slot,
            Slot {
                claim,
                bytes,
                settling: false,
            },
        );
        Held {
            registry: self.clone(),
            slot,
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.snapshot().len()
    }
}

/// The payload bytes of a claim's events, as held in memory.
pub(super) fn claim_bytes(c: &Claim) -> u64 {
    c.events.iter().map(|e| e.payload_len() as u64).sum()
}

/// A claim's place in [`InFlight`]; dropping it forgets the claim.
#[derive(Debug)]
pub(super) struct Held {
    registry: Arc<InFlight>,
    slot: u64,
}

impl Held {
    /// The claim's events were published, those at `acked` acknowledged, and its settle is
    /// next. A claim held by partition ownership (PostgreSQL) now counts as settling rather
    /// than publishing, and the main loop is told: its events are in the claim params until
    /// the settle lands, so the next claim cannot take them again. If [`Claim::acknowledged`]
    /// has a claim to stand for it (an ordered claim with an event acknowledged), the relay's
    /// next claim sees that one from now on. A claim of leased rows stays as it is.
    pub(super) fn acknowledged(&self, claim: &Claim, acked: &[bool]) {
        if !matches!(claim.fence, Fence::Partitions(_)) {
            return;
        }
        let narrowed = claim.acknowledged(acked).map(Arc::new);
        let freed = narrowed.is_some();
        {
            let mut s = self
                .registry
                .claims
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if let Some(slot) = s.by_slot.get_mut(&self.slot) {
                slot.settling = true;
                if let Some(narrowed) = narrowed {
                    slot.claim = narrowed;
                }
            }
        }
        if freed {
            self.registry
                .freed
                .store(true, std::sync::atomic::Ordering::SeqCst);
        }
        self.registry.acknowledged.notify_one();
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut s = self
            .registry
            .claims
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        s.by_slot.remove(&self.slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim() -> Arc<Claim> {
        Arc::new(Claim::leased(
            uuid::Uuid::new_v4(),
            Vec::new(),
            std::time::Instant::now(),
        ))
    }

    #[test]
    fn a_claim_with_no_aggregates_to_free_stays_as_it_is_and_publishing() {
        let reg = Arc::new(InFlight::default());
        let leased = claim();
        let held = reg.hold(leased.clone());
        held.acknowledged(&leased, &[]);
        assert_eq!(reg.publishing(), 1);
        assert!(Arc::ptr_eq(&reg.snapshot()[0], &leased));
    }

    #[test]
    fn a_claim_is_in_flight_until_its_guard_drops() {
        let reg = Arc::new(InFlight::default());
        let a = reg.hold(claim());
        let b = reg.hold(claim());
        assert_eq!(reg.len(), 2);
        drop(a);
        assert_eq!(reg.len(), 1);
        drop(b);
        assert_eq!(reg.len(), 0);
    }
}
