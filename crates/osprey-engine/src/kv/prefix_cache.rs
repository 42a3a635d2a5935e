//! Which full KV blocks hold which token prefixes.
//!
//! A block's identity is a chained hash: the hash of its parent block's hash, a salt (so
//! tenants never share cache unless configured to), and its 16 token ids. Two sequences whose
//! first `k` blocks hold the same tokens therefore share the same `k` hashes, and any request
//! can reuse the KV of any earlier one that shares a prefix with it. Hashes are 128 bits of
//! SHA-256, and every hit is also checked against the block's stored tokens.

use std::collections::HashMap;

use osprey_models::BLOCK_SIZE;
use sha2::{Digest, Sha256};

/// The identity of a full block's content and everything before it.
pub type BlockHash = u128;

/// The hash a sequence's chain starts from, for a given salt.
pub fn root_hash(salt: &str) -> BlockHash {
    digest(&[b"osprey-prefix-root", salt.as_bytes()])
}

/// The hash of a full block of `tokens` following the block hashed `parent`.
pub fn block_hash(parent: BlockHash, tokens: &[u32]) -> BlockHash {
    debug_assert_eq!(tokens.len(), BLOCK_SIZE);
    let mut bytes = [0u8; 4 * BLOCK_SIZE];
    for (chunk, t) in bytes.chunks_exact_mut(4).zip(tokens) {
        chunk.copy_from_slice(&t.to_le_bytes());
    }
    digest(&[&parent.to_le_bytes(), &bytes])
}

/// The hashes of the cached blocks a request for `tokens` (salted with `salt`) can reuse: its
/// full blocks, always leaving the last token to compute. A router hashes a prompt this way to
/// find the worker holding most of it.
pub fn prefix_hashes(salt: &str, tokens: &[u32]) -> Vec<BlockHash> {
    chain_from(root_hash(salt), tokens)
}

/// The key of KV group `group`'s page of the block hashed `hash`: the hash itself for the
/// first group (the one routers see), a hash of both for the others.
pub fn group_key(hash: BlockHash, group: usize) -> BlockHash {
    match group {
        0 => hash,
        g => digest(&[
            b"osprey-kv-group",
            &hash.to_le_bytes(),
            &(g as u64).to_le_bytes(),
        ]),
    }
}

/// [`prefix_hashes`] from a chain's root hash (a [`super::BlockTable`]'s).
pub fn chain_from(root: BlockHash, tokens: &[u32]) -> Vec<BlockHash> {
    let max_blocks = tokens.len().saturating_sub(1) / BLOCK_SIZE;
    let mut parent = root;
    tokens
        .chunks_exact(BLOCK_SIZE)
        .take(max_blocks)
        .map(|chunk| {
            parent = block_hash(parent, chunk);
            parent
        })
        .collect()
}

fn digest(parts: &[&[u8]]) -> BlockHash {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p);
    }
    let d = h.finalize();
    u128::from_le_bytes(d[..16].try_into().expect("16 bytes"))
}

/// The index from block hashes to the blocks holding them.
#[derive(Debug, Default)]
pub struct PrefixCache {
    by_hash: HashMap<BlockHash, u32>,
    /// For each block that is cached: its key (a [`group_key`]), group and tokens.
    by_block: HashMap<u32, Entry>,
}

#[derive(Debug)]
struct Entry {
    key: BlockHash,
    group: usize,
    tokens: [u32; BLOCK_SIZE],
}

impl PrefixCache {
    /// The block holding `hash`, if its tokens are `tokens`.
    pub fn get(&self, hash: BlockHash, tokens: &[u32]) -> Option<u32> {
        let &block = self.by_hash.get(&hash)?;
        (self.by_block[&block].tokens.as_slice() == tokens).then_some(block)
    }

    /// Records that `block` holds KV group `group`'s part of the block hashed `hash` (with
    /// `tokens`), under [`group_key`]. Returns `false`, changing nothing, if another block
    /// already holds that content or `block` is already cached.
    pub fn insert(&mut self, hash: BlockHash, group: usize, block: u32, tokens: &[u32]) -> bool {
        let key = group_key(hash, group);
        if self.by_hash.contains_key(&key) || self.by_block.contains_key(&block) {
            return false;
        }
        let tokens: [u32; BLOCK_SIZE] = tokens.try_into().expect("a full block");
        self.by_hash.insert(key, block);
        let entry = Entry { key, group, tokens };
        self.by_block.insert(block, entry);
        true
    }

    /// Forgets whatever `block` held (it is being reused). Returns its key, group and tokens,
    /// if it held anything.
    pub fn remove_block(&mut self, block: u32) -> Option<(BlockHash, usize, [u32; BLOCK_SIZE])> {
        let e = self.by_block.remove(&block)?;
        self.by_hash.remove(&e.key);
        Some((e.key, e.group, e.tokens))
    }

    /// Whether `block` holds a cached prefix.
    pub fn contains_block(&self, block: u32) -> bool {
        self.by_block.contains_key(&block)
    }

    /// Every cached block with its key and tokens (for invariant checks).
    pub fn entries(&self) -> impl Iterator<Item = (u32, BlockHash, &[u32])> + '_ {
        self.by_block
            .iter()
            .map(|(&b, e)| (b, e.key, e.tokens.as_slice()))
    }

    /// Cached blocks.
    pub fn len(&self) -> usize {
        self.by_block.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.by_block.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_chain_and_salt() {
        let t: Vec<u32> = (0..16).collect();
        let a = block_hash(root_hash(""), &t);
        assert_eq!(a, block_hash(root_hash(""), &t));
        assert_ne!(
            a,
            block_hash(root_hash("tenant-b"), &t),
            "salts separate tenants"
        );
        assert_ne!(block_hash(a, &t), a, "the parent is part of the identity");
    }

    #[test]
    fn hits_are_checked_against_tokens() {
        let mut c = PrefixCache::default();
        let t: Vec<u32> = (0..16).collect();
        let h = block_hash(root_hash(""), &t);
        assert!(c.insert(h, 0, 7, &t));
        assert!(!c.insert(h, 0, 8, &t), "one block per content");
        assert!(
            c.insert(h, 1, 8, &t),
            "another group's part is another page"
        );
        assert_eq!(c.get(group_key(h, 1), &t), Some(8));
        assert_eq!(c.get(h, &t), Some(7));
        let other: Vec<u32> = (1..17).collect();
        assert_eq!(
            c.get(h, &other),
            None,
            "a colliding hash with other tokens is a miss"
        );
        assert_eq!(c.remove_block(7).map(|e| e.0), Some(h));
        assert_eq!(c.get(h, &t), None);
    }
}
