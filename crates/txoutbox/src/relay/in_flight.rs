//! The relay's claims in flight: claimed, not yet settled or released.
//!
//! The relay, not the store, remembers them. Each claim passes the list to the store
//! ([`crate::store::ClaimParams::in_flight`]), so a store that leases no rows (PostgreSQL's
//! ordered claims) can keep this relay's next claim off the aggregates it is still sending.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::store::Claim;

/// Claims in flight, shared by the main loop and the batches' tasks.
#[derive(Debug, Default)]
pub(super) struct InFlight {
    claims: Mutex<Slots>,
}

#[derive(Debug, Default)]
struct Slots {
    next: u64,
    by_slot: HashMap<u64, Arc<Claim>>,
}

impl InFlight {
    /// The claims in flight now.
    pub(super) fn snapshot(&self) -> Vec<Arc<Claim>> {
        match self.claims.lock() {
            Ok(s) => s.by_slot.values().cloned().collect(),
            Err(poisoned) => poisoned.get_ref().by_slot.values().cloned().collect(),
        }
    }

    /// The payload bytes of the claims in flight now.
    pub(super) fn bytes(&self) -> u64 {
        let s = self.claims.lock().unwrap_or_else(|p| p.into_inner());
        s.by_slot.values().map(|c| claim_bytes(c)).sum()
    }

    /// Remember `claim` until the returned guard is dropped (after its settle or release).
    pub(super) fn hold(self: &Arc<Self>, claim: Arc<Claim>) -> Held {
        let mut s = self.claims.lock().unwrap_or_else(|p| p.into_inner());
        let slot = s.next;
        s.next += 1;
        s.by_slot.insert(slot, claim);
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
