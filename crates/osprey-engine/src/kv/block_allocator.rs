//! Reference counts and the free queue of the KV block pool.

/// Marks the end of the intrusive list.
const NIL: u32 = u32::MAX;

/// Hands out blocks of a fixed pool and takes them back.
///
/// Free blocks wait in one queue: blocks with nothing worth keeping are put at its front (reused
/// first), blocks holding a cached prefix at its back, so allocation evicts cached prefixes in
/// least-recently-freed order. A free cached block can be taken back out of the queue by a
/// prefix-cache hit ([`BlockAllocator::acquire`]).
///
/// Invariants: a block is in the free queue if and only if its reference count is 0; every
/// block is either free or referenced; all operations are O(1).
#[derive(Debug)]
pub struct BlockAllocator {
    ref_counts: Vec<u32>,
    prev: Vec<u32>,
    next: Vec<u32>,
    head: u32,
    tail: u32,
    num_free: usize,
}

impl BlockAllocator {
    /// A pool of `total` blocks, all free.
    pub fn new(total: usize) -> Self {
        assert!(total < NIL as usize, "pool too large");
        let mut a = Self {
            ref_counts: vec![0; total],
            prev: vec![NIL; total],
            next: vec![NIL; total],
            head: NIL,
            tail: NIL,
            num_free: 0,
        };
        for b in 0..total as u32 {
            a.push_back(b);
        }
        a
    }

    /// Blocks in the pool.
    pub fn num_total(&self) -> usize {
        self.ref_counts.len()
    }

    /// Blocks not referenced by any sequence (some may still hold cached prefixes).
    pub fn num_free(&self) -> usize {
        self.num_free
    }

    /// References held on `block`.
    pub fn ref_count(&self, block: u32) -> u32 {
        self.ref_counts[block as usize]
    }

    /// Takes the block at the front of the free queue, with one reference. The caller must
    /// forget any cached prefix the block held.
    pub fn allocate(&mut self) -> Option<u32> {
        let b = self.head;
        if b == NIL {
            return None;
        }
        self.unlink(b);
        self.ref_counts[b as usize] = 1;
        Some(b)
    }

    /// Adds a reference to `block`, taking it out of the free queue if it was free.
    pub fn acquire(&mut self, block: u32) {
        if self.ref_counts[block as usize] == 0 {
            self.unlink(block);
        }
        self.ref_counts[block as usize] += 1;
    }

    /// Drops a reference; the last one returns the block to the free queue — at the back
    /// if it holds a cached prefix (`cached`), so it is evicted last, else at the front.
    pub fn release(&mut self, block: u32, cached: bool) {
        let rc = &mut self.ref_counts[block as usize];
        assert!(*rc > 0, "block {block} released more often than acquired");
        *rc -= 1;
        if *rc == 0 {
            if cached {
                self.push_back(block);
            } else {
                self.push_front(block);
            }
        }
    }

    /// The first `n` free blocks in queue order: the next to be reused.
    pub fn free_front(&self, n: usize) -> impl Iterator<Item = u32> + '_ {
        let mut b = self.head;
        std::iter::from_fn(move || {
            let here = b;
            (here != NIL).then(|| {
                b = self.next[here as usize];
                here
            })
        })
        .take(n)
    }

    /// Free blocks in queue order (for tests and invariant checks).
    pub fn free_queue(&self) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.num_free);
        let mut b = self.head;
        while b != NIL {
            out.push(b);
            b = self.next[b as usize];
        }
        out
    }

    fn unlink(&mut self, b: u32) {
        let (p, n) = (self.prev[b as usize], self.next[b as usize]);
        if p == NIL {
            self.head = n
        } else {
            self.next[p as usize] = n
        }
        if n == NIL {
            self.tail = p
        } else {
            self.prev[n as usize] = p
        }
        self.prev[b as usize] = NIL;
        self.next[b as usize] = NIL;
        self.num_free -= 1;
    }

    fn push_back(&mut self, b: u32) {
        self.prev[b as usize] = self.tail;
        self.next[b as usize] = NIL;
        if self.tail == NIL {
            self.head = b
        } else {
            self.next[self.tail as usize] = b
        }
        self.tail = b;
        self.num_free += 1;
    }

    fn push_front(&mut self, b: u32) {
        self.next[b as usize] = self.head;
        self.prev[b as usize] = NIL;
        if self.head == NIL {
            self.tail = b
        } else {
            self.prev[self.head as usize] = b
        }
        self.head = b;
        self.num_free += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uncached_blocks_are_reused_first_and_cached_ones_evicted_oldest_first() {
        let mut a = BlockAllocator::new(4);
        let blocks: Vec<u32> = (0..4).map(|_| a.allocate().unwrap()).collect();
        assert_eq!(blocks, [0, 1, 2, 3]);
        assert_eq!(a.allocate(), None);
        a.release(0, true);
        a.release(1, false);
        a.release(2, true);
        assert_eq!(a.free_queue(), [1, 0, 2]);
        a.acquire(0); // a prefix-cache hit takes block 0 back
        assert_eq!(a.free_queue(), [1, 2]);
        assert_eq!(a.ref_count(0), 1);
        assert_eq!(a.allocate(), Some(1));
        assert_eq!(a.allocate(), Some(2));
        assert_eq!(a.num_free(), 0);
    }

    #[test]
    #[should_panic(expected = "released more often")]
    fn double_release_is_caught() {
        let mut a = BlockAllocator::new(1);
        let b = a.allocate().unwrap();
        a.release(b, false);
        a.release(b, false);
    }
}
