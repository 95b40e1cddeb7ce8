//! The global byte budget for recorded bodies held in memory (serve's `--record-memory`),
//! and the hold a row keeps on it until the writer has encoded the row. A leaf.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

/// A global byte budget for recorded bodies held in memory (serve's `--record-memory`).
#[derive(Debug)]
pub struct MemoryBudget {
    remaining: AtomicI64,
}

impl MemoryBudget {
    pub fn new(bytes: usize) -> Arc<MemoryBudget> {
        Arc::new(MemoryBudget {
            remaining: AtomicI64::new(i64::try_from(bytes).unwrap_or(i64::MAX)),
        })
    }

    /// Take up to `want` bytes; returns what was granted (0 when the budget is spent).
    pub fn take(&self, want: usize) -> usize {
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

    pub fn give_back(&self, bytes: usize) {
        self.remaining
            .fetch_add(i64::try_from(bytes).unwrap_or(0), Ordering::Relaxed);
    }

    pub fn remaining(&self) -> i64 {
        self.remaining.load(Ordering::Relaxed)
    }
}

/// Bytes of a [`MemoryBudget`] held by one row until the writer has encoded it.
#[derive(Debug)]
pub struct BudgetHold {
    budget: Arc<MemoryBudget>,
    bytes: usize,
}

impl BudgetHold {
    pub fn new(budget: Arc<MemoryBudget>, bytes: usize) -> BudgetHold {
        BudgetHold { budget, bytes }
    }

    pub fn add(&mut self, bytes: usize) {
        self.bytes += bytes;
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
        let hold = BudgetHold::new(b.clone(), 10);
        drop(hold);
        assert_eq!(b.remaining(), 10);
    }
}
