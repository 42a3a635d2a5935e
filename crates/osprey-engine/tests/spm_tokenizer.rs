//! The SentencePiece (`llama`) tokenizer path — Llama 2 and Mistral GGUFs — on a small
//! vocabulary written into a real GGUF file.

use candle_core::quantized::gguf_file::{self, Value};
use osprey_engine::Tokenizer;
use osprey_models::GgufFile;

fn spm_gguf() -> std::path::PathBuf {
    // (piece, score, type): 1 normal, 2 unknown, 3 control, 6 byte.
    let mut vocab: Vec<(String, f32, i32)> = vec![
        ("<unk>".into(), 0.0, 2),
        ("<s>".into(), 0.0, 3),
        ("</s>".into(), 0.0, 3),
    ];
    for b in 0..=255u8 {
        vocab.push((format!("<0x{b:02X}>"), 0.0, 6));
    }
    for (piece, score) in [
        ("▁", -1.0),
        ("h", -2.0),
        ("e", -2.0),
        ("l", -2.0),
        ("o", -2.0),
        ("w", -2.0),
        ("r", -2.0),
        ("d", -2.0),
        ("▁h", -3.0),
        ("ll", -3.5),
        ("llo", -4.0),
        ("▁he", -4.5),
        ("▁hello", -5.0),
        ("▁w", -3.0),
        ("or", -3.2),
        ("▁wor", -6.0),
        ("ld", -3.1),
        ("▁world", -7.0),
    ] {
        vocab.push((piece.into(), score, 1));
    }
    let meta: Vec<(&str, Value)> = vec![
        ("general.architecture", Value::String("llama".into())),
        ("tokenizer.ggml.model", Value::String("llama".into())),
        (
            "tokenizer.ggml.tokens",
            Value::Array(vocab.iter().map(|v| Value::String(v.0.clone())).collect()),
        ),
        (
            "tokenizer.ggml.scores",
            Value::Array(vocab.iter().map(|v| Value::F32(v.1)).collect()),
        ),
        (
            "tokenizer.ggml.token_type",
            Value::Array(vocab.iter().map(|v| Value::I32(v.2)).collect()),
        ),
        ("tokenizer.ggml.bos_token_id", Value::U32(1)),
        ("tokenizer.ggml.eos_token_id", Value::U32(2)),
        ("tokenizer.ggml.unknown_token_id", Value::U32(0)),
    ];
    let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("spm-tokenizer.gguf");
    let refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (*k, v)).collect();
    let mut f = std::fs::File::create(&path).unwrap();
    gguf_file::write(&mut f, &refs, &[]).unwrap();
    path
}

#[test]
fn sentencepiece_vocabularies_merge_by_score_and_fall_back_to_bytes() {
    let tok = Tokenizer::from_gguf(&GgufFile::open(&spm_gguf()).unwrap()).unwrap();
    let id = |piece: &str| {
        (0..tok.vocab_size() as u32)
            .find(|&i| tok.id_to_token(i).as_deref() == Some(piece))
            .unwrap()
    };
    // BOS is added by default for SentencePiece models; a space is prepended to the text.
    assert_eq!(
        tok.encode("hello world", true),
        vec![1, id("▁hello"), id("▁world")]
    );
    assert_eq!(tok.decode(&[id("▁hello"), id("▁world")]), " hello world");
    // Characters outside the vocabulary become their UTF-8 bytes and decode back.
    let ids = tok.encode("hé", false);
    assert_eq!(ids, vec![id("▁h"), id("<0xC3>"), id("<0xA9>")]);
    assert_eq!(tok.decode(&ids), " hé");
    assert_eq!(tok.end_of_generation(), &[2]);
    // Control tokens written in text are parsed as such, and never shown.
    assert_eq!(tok.encode("</s>", false), vec![2]);
    assert_eq!(tok.decode(&[2]), "");
}
