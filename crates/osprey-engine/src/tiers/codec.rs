//! How a KV block is stored below the hot pool: as it is (`f16`), or compressed to `int8` with
//! one scale per layer, side (keys or values) and KV head.
//!
//! A block's contents ([`osprey_models::KvCache::read_block`]) are groups of
//! `BLOCK_SIZE · head_dim` `f16` values, one per (layer, side, head). `int8` stores each group
//! as its absolute maximum over 127 (an `f32` scale) and the values rounded to that step:
//! every value is off by at most half a step, and a block takes a little over half its bytes.

use half::f16;

/// The stored form of blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Codec {
    /// Lossless: the pool's own `f16`.
    F16,
    /// `int8` with a scale per (layer, side, head).
    #[default]
    Int8,
}

impl Codec {
    /// The codec's name in flags and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::F16 => "f16",
            Self::Int8 => "int8",
        }
    }

    /// The codec named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        [Self::F16, Self::Int8]
            .into_iter()
            .find(|c| c.as_str() == name)
    }

    /// Encodes a block's `f16` bits, in groups of `group` values.
    pub fn encode(self, data: &[u16], group: usize) -> Vec<u8> {
        match self {
            Self::F16 => data.iter().flat_map(|v| v.to_le_bytes()).collect(),
            Self::Int8 => {
                let mut out = Vec::with_capacity(data.len() + data.len() / group * 4);
                let mut values = vec![0f32; group];
                for g in data.chunks_exact(group) {
                    for (v, &bits) in values.iter_mut().zip(g) {
                        *v = f16::from_bits(bits).to_f32();
                    }
                    let max = values.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let scale = if max > 0.0 { max / 127.0 } else { 1.0 };
                    out.extend_from_slice(&scale.to_le_bytes());
                    out.extend(
                        values
                            .iter()
                            .map(|v| (v / scale).round().clamp(-127.0, 127.0) as i8 as u8),
                    );
                }
                out
            }
        }
    }

    /// Decodes what [`Self::encode`] wrote for a block of `len` values into `f16` bits, or
    /// `None` if the bytes have the wrong size.
    pub fn decode(self, bytes: &[u8], len: usize, group: usize) -> Option<Vec<u16>> {
        match self {
            Self::F16 => (bytes.len() == 2 * len).then(|| {
                bytes
                    .chunks_exact(2)
                    .map(|b| u16::from_le_bytes([b[0], b[1]]))
                    .collect()
            }),
            Self::Int8 => {
                if group == 0
                    || !len.is_multiple_of(group)
                    || bytes.len() != self.encoded_len(len, group)
                {
                    return None;
                }
                let mut out = Vec::with_capacity(len);
                for g in bytes.chunks_exact(4 + group) {
                    let scale = f32::from_le_bytes([g[0], g[1], g[2], g[3]]);
                    out.extend(
                        g[4..]
                            .iter()
                            .map(|&q| f16::from_f32(q as i8 as f32 * scale).to_bits()),
                    );
                }
                Some(out)
            }
        }
    }

    /// Bytes a block of `len` values takes.
    pub fn encoded_len(self, len: usize, group: usize) -> usize {
        match self {
            Self::F16 => 2 * len,
            Self::Int8 => len + len / group.max(1) * 4,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(len: usize) -> Vec<u16> {
        (0..len)
            .map(|i| f16::from_f32(((i * 7919) % 1000) as f32 / 100.0 - 5.0).to_bits())
            .collect()
    }

    #[test]
    fn f16_is_lossless() {
        let data = block(256);
        let bytes = Codec::F16.encode(&data, 64);
        assert_eq!(bytes.len(), Codec::F16.encoded_len(256, 64));
        assert_eq!(Codec::F16.decode(&bytes, 256, 64), Some(data));
    }

    #[test]
    fn int8_is_within_half_a_step_of_each_group_and_about_half_the_size() {
        let mut data = block(256);
        // One group of zeros, one with a single large value.
        data[64..128].fill(0);
        data[128] = f16::from_f32(300.0).to_bits();
        let bytes = Codec::Int8.encode(&data, 64);
        assert_eq!(bytes.len(), 256 + 4 * 4);
        let back = Codec::Int8.decode(&bytes, 256, 64).unwrap();
        for (g, (a, b)) in data.chunks(64).zip(back.chunks(64)).enumerate() {
            let max = a
                .iter()
                .map(|&x| f16::from_bits(x).to_f32().abs())
                .fold(0f32, f32::max);
            let step = max / 127.0;
            for (&x, &y) in a.iter().zip(b) {
                let (x, y) = (f16::from_bits(x).to_f32(), f16::from_bits(y).to_f32());
                // Half a step, plus f16's own rounding of the result.
                assert!(
                    (x - y).abs() <= step / 2.0 + x.abs() / 1024.0 + 1e-6,
                    "group {g}: {x} vs {y}"
                );
            }
        }
        assert!(
            back[64..128]
                .iter()
                .all(|&v| f16::from_bits(v).to_f32() == 0.0)
        );
    }

    #[test]
    fn wrong_sizes_do_not_decode() {
        let bytes = Codec::Int8.encode(&block(128), 64);
        assert_eq!(Codec::Int8.decode(&bytes[1..], 128, 64), None);
        assert_eq!(Codec::F16.decode(&[0, 1, 2], 2, 64), None);
    }
}
