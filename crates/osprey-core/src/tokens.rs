//! How many tokens a text is, when no tokenizer is at hand (an upstream's model, a limit
//! charged before the request is parsed): one home for the estimate.

/// Characters (or bytes of JSON) per token: the usual rate of BPE vocabularies on English text.
pub const CHARS_PER_TOKEN: usize = 4;

/// Roughly how many tokens `text` is.
pub fn estimate(text: &str) -> usize {
    text.chars().count().div_ceil(CHARS_PER_TOKEN)
}

/// Roughly how many tokens of prompt a request body of `bytes` bytes carries.
pub fn estimate_body(bytes: usize) -> u64 {
    (bytes / CHARS_PER_TOKEN) as u64
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_token_is_about_four_characters() {
        assert_eq!(super::estimate(""), 0);
        assert_eq!(super::estimate("abcde"), 2);
        assert_eq!(super::estimate("ééé"), 1, "characters, not bytes");
        assert_eq!(super::estimate_body(4096), 1024);
    }
}
