//! The model's tokenizer, built from GGUF metadata with the `tokenizers` crate.
//!
//! Two GGUF tokenizer models are supported, as llama.cpp names them:
//! - `gpt2`: byte-level BPE from `tokens` + `merges`, with the pre-tokenizer regexes that
//!   `tokenizer.ggml.pre` names (SmolLM, Llama 3, Qwen2, …);
//! - `llama`: SentencePiece BPE from `tokens` + `scores` (merges derived from the scores, as
//!   HF's converter does), with byte fallback.
//!
//! Control tokens (type 3) and user-defined tokens (type 4) are added tokens, so text like
//! `<|im_start|>` is parsed as the special token. Decoding goes through each token's raw bytes,
//! which is what lets streaming output never cut a UTF-8 character in half.

use std::collections::HashMap;

use osprey_models::{GgufFile, ModelError};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::{Prepend, Replace};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, NormalizerWrapper, PreTokenizerWrapper, SplitDelimiterBehavior};

const TYPE_CONTROL: i64 = 3;
const TYPE_USER_DEFINED: i64 = 4;
const TYPE_BYTE: i64 = 6;

const GPT2_REGEX: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
const LLAMA3_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const TEKKEN_REGEX: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Pre-tokenizer regexes for a `tokenizer.ggml.pre` value (llama.cpp's table).
fn pre_tokenizer_regexes(pre: &str) -> Vec<&'static str> {
    match pre {
        "llama3" | "llama-bpe" | "llama-v3" | "falcon3" | "pixtral" => vec![LLAMA3_REGEX],
        "qwen2" | "deepseek-r1-qwen" | "megrez" => vec![QWEN2_REGEX],
        "tekken" => vec![TEKKEN_REGEX],
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b" => {
            vec![r"\p{N}", GPT2_REGEX]
        }
        _ => vec![GPT2_REGEX],
    }
}

/// A model's tokenizer and its special tokens.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// Raw bytes of each token's text (empty for control tokens).
    bytes: Vec<Vec<u8>>,
    /// Which ids are control tokens (never shown as text).
    control: Vec<bool>,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    /// Tokens that end generation: EOS plus end-of-turn markers.
    eog: Vec<u32>,
}

impl Tokenizer {
    /// Builds the tokenizer described by the GGUF's `tokenizer.ggml.*` metadata.
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self, ModelError> {
        let err = |m: String| ModelError::Tokenizer(m);
        let model = gguf.str("tokenizer.ggml.model")?;
        let tokens: Vec<String> = gguf
            .opt_array("tokenizer.ggml.tokens")?
            .ok_or_else(|| err("no tokenizer.ggml.tokens".into()))?
            .iter()
            .map(|v| v.to_string().cloned())
            .collect::<Result<_, _>>()
            .map_err(|e| err(format!("tokens: {e}")))?;
        let types: Vec<i64> = match gguf.opt_array("tokenizer.ggml.token_type")? {
            Some(a) => a
                .iter()
                .map(|v| v.to_i32().map(i64::from).unwrap_or(1))
                .collect(),
            None => vec![1; tokens.len()],
        };
        let vocab: HashMap<String, u32> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let id = |key: &str| -> Result<Option<u32>, ModelError> {
            Ok(gguf
                .opt_uint(key)?
                .map(|v| v as u32)
                .filter(|&v| (v as usize) < tokens.len()))
        };
        let bos = id("tokenizer.ggml.bos_token_id")?;
        let eos = id("tokenizer.ggml.eos_token_id")?;

        let (mut inner, bytes) = match model {
            "gpt2" => {
                let merges = merges_from_gguf(gguf)?;
                let pre = gguf.str("tokenizer.ggml.pre").unwrap_or("default");
                (
                    gpt2_tokenizer(vocab, merges, pre)?,
                    gpt2_token_bytes(&tokens),
                )
            }
            "llama" => {
                let scores: Vec<f32> = match gguf.opt_array("tokenizer.ggml.scores")? {
                    Some(a) => a.iter().map(|v| v.to_f32().unwrap_or(0.0)).collect(),
                    None => vec![0.0; tokens.len()],
                };
                let add_space = gguf
                    .opt_bool("tokenizer.ggml.add_space_prefix")?
                    .unwrap_or(true);
                let unk =
                    id("tokenizer.ggml.unknown_token_id")?.map(|i| tokens[i as usize].clone());
                (
                    spm_tokenizer(&tokens, &scores, &types, vocab, unk, add_space)?,
                    spm_token_bytes(&tokens, &types),
                )
            }
            other => {
                return Err(err(format!(
                    "unsupported tokenizer model `{other}` (supported: gpt2, llama)"
                )));
            }
        };
        let control: Vec<bool> = types.iter().map(|&t| t == TYPE_CONTROL).collect();
        let mut bytes = bytes;
        for (b, _) in bytes.iter_mut().zip(&control).filter(|(_, c)| **c) {
            b.clear();
        }
        let added: Vec<AddedToken> = tokens
            .iter()
            .zip(&types)
            .filter(|(_, t)| **t == TYPE_CONTROL || **t == TYPE_USER_DEFINED)
            .map(|(tok, &t)| AddedToken::from(tok.clone(), t == TYPE_CONTROL).normalized(false))
            .collect();
        inner
            .add_special_tokens(added)
            .map_err(|e| err(format!("special tokens: {e}")))?;

        let mut eog: Vec<u32> = eos.into_iter().collect();
        for name in [
            "<|im_end|>",
            "<|eot_id|>",
            "<|end_of_text|>",
            "<|endoftext|>",
            "<end_of_turn>",
            "<|end|>",
        ] {
            if let Some(&i) = inner.get_vocab(true).get(name)
                && control.get(i as usize) == Some(&true)
                && !eog.contains(&i)
            {
                eog.push(i);
            }
        }
        if let Some(e) = id("tokenizer.ggml.eot_token_id")?
            && !eog.contains(&e)
        {
            eog.push(e);
        }
        Ok(Self {
            inner,
            bytes,
            control,
            bos,
            eos,
            add_bos: gguf
                .opt_bool("tokenizer.ggml.add_bos_token")?
                .unwrap_or(model == "llama"),
            eog,
        })
    }

    /// Token ids of `text`. Special tokens written in the text are parsed as such; the BOS
    /// token is prepended when the model asks for it and `add_special` is set.
    pub fn encode(&self, text: &str, add_special: bool) -> Vec<u32> {
        let mut ids = Vec::with_capacity(text.len() / 3 + 2);
        if add_special
            && self.add_bos
            && let Some(b) = self.bos
        {
            ids.push(b);
        }
        match self.inner.encode_fast(text, false) {
            Ok(enc) => ids.extend_from_slice(enc.get_ids()),
            // The models used here cannot fail on any string; keep the contract total anyway.
            Err(e) => tracing::error!(error = %e, "tokenizer failed on input"),
        }
        ids
    }

    /// Text of `ids`, control tokens omitted; invalid UTF-8 is replaced.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            bytes.extend_from_slice(self.token_bytes(id));
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The raw bytes a token stands for (empty for control tokens and unknown ids).
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        self.bytes.get(id as usize).map_or(&[], Vec::as_slice)
    }

    /// A token's text for display in log-probabilities: control tokens by name, other bytes
    /// decoded lossily.
    pub fn token_text(&self, id: u32) -> String {
        if self.is_control(id) {
            return self.inner.id_to_token(id).unwrap_or_default();
        }
        String::from_utf8_lossy(self.token_bytes(id)).into_owned()
    }

    /// Whether `id` is a control token.
    pub fn is_control(&self, id: u32) -> bool {
        self.control.get(id as usize).copied().unwrap_or(false)
    }

    /// Number of tokens.
    pub fn vocab_size(&self) -> usize {
        self.bytes.len()
    }

    /// The beginning-of-sequence token.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// The end-of-sequence token.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// Tokens that end generation (EOS and end-of-turn markers).
    pub fn end_of_generation(&self) -> &[u32] {
        &self.eog
    }

    /// The text of token `id` as stored in the vocabulary (special tokens by name).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }
}

fn merges_from_gguf(gguf: &GgufFile) -> Result<Vec<(String, String)>, ModelError> {
    let arr = gguf.opt_array("tokenizer.ggml.merges")?.ok_or_else(|| {
        ModelError::Tokenizer("gpt2 tokenizer without tokenizer.ggml.merges".into())
    })?;
    arr.iter()
        .map(|v| {
            let s = v
                .to_string()
                .map_err(|e| ModelError::Tokenizer(e.to_string()))?;
            let (a, b) = s
                .split_once(' ')
                .ok_or_else(|| ModelError::Tokenizer(format!("malformed merge `{s}`")))?;
            Ok((a.to_owned(), b.to_owned()))
        })
        .collect()
}

fn gpt2_tokenizer(
    vocab: HashMap<String, u32>,
    merges: Vec<(String, String)>,
    pre: &str,
) -> Result<tokenizers::Tokenizer, ModelError> {
    let bpe = BPE::builder()
        .vocab_and_merges(
            vocab
                .into_iter()
                .collect::<tokenizers::models::bpe::Vocab>(),
            merges,
        )
        .build()
        .map_err(|e| ModelError::Tokenizer(e.to_string()))?;
    let mut parts: Vec<PreTokenizerWrapper> = Vec::new();
    for re in pre_tokenizer_regexes(pre) {
        let split = Split::new(
            SplitPattern::Regex(re.into()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| ModelError::Tokenizer(format!("pre-tokenizer regex: {e}")))?;
        parts.push(split.into());
    }
    parts.push(ByteLevel::new(false, false, false).into());
    let mut tok = tokenizers::Tokenizer::new(bpe);
    tok.with_pre_tokenizer(Some(Sequence::new(parts)));
    tok.with_decoder(Some(ByteLevelDecoder::default()));
    Ok(tok)
}

/// GPT-2's byte-to-character table, inverted: each vocabulary character back to its byte.
fn gpt2_token_bytes(tokens: &[String]) -> Vec<Vec<u8>> {
    let mut char_to_byte = HashMap::new();
    let mut n = 0u32;
    for b in 0..=255u8 {
        let printable =
            (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        let c = if printable {
            char::from(b)
        } else {
            n += 1;
            char::from_u32(255 + n).unwrap_or('?')
        };
        char_to_byte.insert(c, b);
    }
    tokens
        .iter()
        .map(|t| {
            // Tokens outside the byte alphabet (added tokens) are their own UTF-8 text.
            t.chars()
                .map(|c| char_to_byte.get(&c).copied())
                .collect::<Option<Vec<u8>>>()
                .unwrap_or_else(|| t.as_bytes().to_vec())
        })
        .collect()
}

fn spm_tokenizer(
    tokens: &[String],
    scores: &[f32],
    types: &[i64],
    vocab: HashMap<String, u32>,
    unk: Option<String>,
    add_space_prefix: bool,
) -> Result<tokenizers::Tokenizer, ModelError> {
    // SentencePiece merges two pieces when their concatenation is in the vocabulary, best
    // score first: list every such pair, ordered by the merged piece's score.
    let mut merges: Vec<(f32, u32, String, String)> = Vec::new();
    for (id, piece) in tokens.iter().enumerate() {
        if types[id] == TYPE_CONTROL || types[id] == TYPE_BYTE {
            continue;
        }
        for (split, _) in piece.char_indices().skip(1) {
            let (l, r) = piece.split_at(split);
            if vocab.contains_key(l) && vocab.contains_key(r) {
                merges.push((scores[id], id as u32, l.to_owned(), r.to_owned()));
            }
        }
    }
    merges.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let merges = merges.into_iter().map(|(_, _, l, r)| (l, r)).collect();
    let mut builder = BPE::builder()
        .vocab_and_merges(
            vocab
                .into_iter()
                .collect::<tokenizers::models::bpe::Vocab>(),
            merges,
        )
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(u) = unk {
        builder = builder.unk_token(u);
    }
    let bpe = builder
        .build()
        .map_err(|e| ModelError::Tokenizer(e.to_string()))?;
    let mut tok = tokenizers::Tokenizer::new(bpe);
    let replace = Replace::new(" ", "▁").map_err(|e| ModelError::Tokenizer(e.to_string()))?;
    let normalizer: NormalizerWrapper = if add_space_prefix {
        tokenizers::normalizers::Sequence::new(vec![
            Prepend::new("▁".into()).into(),
            replace.into(),
        ])
        .into()
    } else {
        replace.into()
    };
    tok.with_normalizer(Some(normalizer))
        .map_err(|e| ModelError::Tokenizer(e.to_string()))?;
    Ok(tok)
}

/// SentencePiece pieces as bytes: `▁` is a space, `<0xAB>` a raw byte.
fn spm_token_bytes(tokens: &[String], types: &[i64]) -> Vec<Vec<u8>> {
    tokens
        .iter()
        .zip(types)
        .map(|(t, &ty)| {
            if ty == TYPE_BYTE
                && let Some(hex) = t.strip_prefix("<0x").and_then(|h| h.strip_suffix('>'))
                && let Ok(b) = u8::from_str_radix(hex, 16)
            {
                return vec![b];
            }
            t.replace('▁', " ").into_bytes()
        })
        .collect()
}
