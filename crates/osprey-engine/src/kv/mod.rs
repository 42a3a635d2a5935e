//! KV memory management: the block pool, the prefix cache, and per-sequence block tables.
//! Pure data structures, no I/O and no model: see `README.md` beside this file.

pub mod block_allocator;
pub mod block_table;
pub mod manager;
pub mod prefix_cache;

pub use block_allocator::BlockAllocator;
pub use manager::{
    BlockTable, EvictedBlock, KvCacheCounters, KvCacheManager, KvChanges, SharedKvCacheManager,
};
pub use prefix_cache::{BlockHash, PrefixCache, chain_from, group_key, prefix_hashes};
