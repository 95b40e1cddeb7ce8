//! The global byte budget for recorded bodies held in memory (serve's `--record-memory`),
//! and the hold a row keeps on it until the writer has encoded the row. A leaf.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

/// A global byte budget for recorded bodies held in memory (serve's `--record-memory`).
#[derive(Debug)]
pub(crate) struct MemoryBudget {
    remaining: AtomicI64,
}

impl MemoryBudget {
    pub(crate) fn new(bytes: usize) -> Arc<MemoryBudget> {
        Arc::new(MemoryBudget {
            remaining: AtomicI64::new(i64::try_from(bytes).unwrap_or(i64::MAX)),
        })
    }

    /// Take up to `want` bytes; returns what was granted (0 when the budget is spent).
    pub(crate) fn take(&self, want: usize) -> usize {
        let want = i64::try_from(want).unwrap_or(i64::MAX);
        let mut cur = self.remaining.load(Ordering::Relaxed);
        loop {
            let grant = want.min(cur.max(0));
            if grant == 0 {
                return 0;
            }
            match self.remaining.compare_exchange_weak(
                cur,
                cur - grant,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return grant as usize,
                Err(actual) => cur = actual,
            }
        }
    }

    pub(crate) fn give_back(&self, bytes: usize) {
        self.remaining
            .fetch_add(i64::try_from(bytes).unwrap_or(0), Ordering::Relaxed);
    }

    #[cfg(test)]
    pub(crate) fn remaining(&self) -> i64 {
        self.remaining.load(Ordering::Relaxed)
    }
}

/// Bytes of a [`MemoryBudget`] held by one recorded copy, and then by its row until the
/// writer has encoded it. Dropping the hold gives its bytes back, wherever that happens.
#[derive(Debug)]
pub struct BudgetHold {
    budget: Arc<MemoryBudget>,
    bytes: usize,
}

impl BudgetHold {
    /// A hold of nothing yet on `budget`.
    pub(crate) fn new(budget: Arc<MemoryBudget>) -> BudgetHold {
        BudgetHold { budget, bytes: 0 }
    }

    /// Draw up to `want` more bytes from the budget; returns what was granted.
    pub(crate) fn draw(&mut self, want: usize) -> usize {
        let granted = self.budget.take(want);
        self.bytes += granted;
        granted
    }

    /// Take over `other`'s bytes (both holds are on the same budget).
    pub(crate) fn absorb(&mut self, mut other: BudgetHold) {
        self.bytes += std::mem::take(&mut other.bytes);
    }

    /// The holds of a row's two bodies as one (`None` when neither holds anything).
    pub(crate) fn merge(a: Option<BudgetHold>, b: Option<BudgetHold>) -> Option<BudgetHold> {
        match (a, b) {
            (Some(mut a), Some(b)) => {
                a.absorb(b);
                Some(a)
            }
            (a, b) => a.or(b),
        }
    }
}

impl Drop for BudgetHold {
    fn drop(&mut self) {
        self.budget.give_back(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_budget_grants_what_is_left_and_holds_release_it() {
        let b = MemoryBudget::new(10);
        assert_eq!(b.take(4), 4);
        assert_eq!(b.take(10), 6);
        assert_eq!(b.take(1), 0);
        b.give_back(10);
        let mut first = BudgetHold::new(b.clone());
        assert_eq!(first.draw(4), 4);
        let mut second = BudgetHold::new(b.clone());
        assert_eq!(second.draw(10), 6);
        assert_eq!(b.remaining(), 0);
        let both = BudgetHold::merge(Some(first), Some(second));
        assert_eq!(b.remaining(), 0, "merging gives nothing back");
        drop(both);
        assert_eq!(
            b.remaining(),
            10,
            "dropping the merged hold gives back all of it"
        );
    }
}
