//! KV block bookkeeping: which blocks of the pool are free, and who holds the rest.
//!
//! A [`BlockTable`] owns its blocks and gives them back when dropped, so a sequence that
//! finishes, fails or is cancelled can never leak KV memory.

use std::cell::RefCell;
use std::rc::Rc;

use osprey_models::BLOCK_SIZE;

/// The free list of the KV pool. Shared (single-threaded) between the scheduler and the
/// block tables it hands out.
pub struct BlockAllocator {
    free: Vec<u32>,
    total: usize,
}

/// A shared handle to the allocator.
pub type SharedAllocator = Rc<RefCell<BlockAllocator>>;

impl BlockAllocator {
    /// An allocator over blocks `0..total`, all free.
    pub fn new(total: usize) -> SharedAllocator {
        // Reversed so blocks are handed out from 0 upwards.
        Rc::new(RefCell::new(Self {
            free: (0..total as u32).rev().collect(),
            total,
        }))
    }

    /// Free blocks.
    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    /// All blocks.
    pub fn num_total(&self) -> usize {
        self.total
    }
}

/// The blocks holding one sequence's KV, in position order.
pub struct BlockTable {
    blocks: Vec<u32>,
    allocator: SharedAllocator,
}

impl BlockTable {
    /// An empty table drawing from `allocator`.
    pub fn new(allocator: SharedAllocator) -> Self {
        Self {
            blocks: Vec::new(),
            allocator,
        }
    }

    /// Block ids, in position order.
    pub fn blocks(&self) -> &[u32] {
        &self.blocks
    }

    /// Grows the table to hold `tokens` positions. Returns `false`, taking nothing, if the
    /// pool has too few free blocks.
    pub fn reserve(&mut self, tokens: usize) -> bool {
        let needed = tokens
            .div_ceil(BLOCK_SIZE)
            .saturating_sub(self.blocks.len());
        let mut alloc = self.allocator.borrow_mut();
        if alloc.free.len() < needed {
            return false;
        }
        let at = alloc.free.len() - needed;
        self.blocks.extend(alloc.free.drain(at..).rev());
        true
    }

    /// Free blocks a reservation of `tokens` positions would take.
    pub fn blocks_needed(&self, tokens: usize) -> usize {
        tokens
            .div_ceil(BLOCK_SIZE)
            .saturating_sub(self.blocks.len())
    }

    /// Returns every block to the pool.
    pub fn release(&mut self) {
        self.allocator
            .borrow_mut()
            .free
            .extend(self.blocks.drain(..).rev());
    }
}

impl Drop for BlockTable {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_reserve_and_return_blocks() {
        let alloc = BlockAllocator::new(4);
        let mut a = BlockTable::new(alloc.clone());
        assert!(a.reserve(BLOCK_SIZE + 1));
        assert_eq!(a.blocks(), &[0, 1]);
        assert!(a.reserve(2 * BLOCK_SIZE), "already covered");
        assert_eq!(alloc.borrow().num_free(), 2);
        let mut b = BlockTable::new(alloc.clone());
        assert!(!b.reserve(3 * BLOCK_SIZE), "only two left");
        assert_eq!(
            alloc.borrow().num_free(),
            2,
            "a failed reservation takes nothing"
        );
        drop(a);
        assert_eq!(alloc.borrow().num_free(), 4);
        assert!(b.reserve(4 * BLOCK_SIZE));
    }
}
