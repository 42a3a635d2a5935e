//! PII and secrets in text: each detector is a pattern for candidates and, where the format
//! has one, a check that rejects look-alikes (Luhn for cards, mod 97 for IBANs, the allocation
//! rules of US SSNs, octet ranges for IPv4, the standard parser for IPv6, Shannon entropy for
//! unprefixed secrets). Spans are in characters of the original text; overlapping finds keep
//! the longest (and, at equal length, the first detector's).

use std::sync::LazyLock;

use regex::Regex;
use serde::Serialize;

use crate::{Category, Finding, Guard, Source, Span};

/// The kinds of PII found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PiiKind {
    /// An email address.
    Email,
    /// A phone number in international (`+44 20 7946 0958`) or North American format.
    Phone,
    /// A payment card number that passes the Luhn check and starts like a card.
    CreditCard,
    /// An IBAN whose check digits are right.
    Iban,
    /// A US social security number in an allocatable range.
    UsSsn,
    /// A UK National Insurance number.
    UkNino,
    /// An IPv4 or IPv6 address.
    IpAddress,
    /// An API key, token or private key.
    Secret,
    /// A street address (number, name, street type).
    Address,
    /// A person's name after a title or an introduction.
    PersonName,
}

impl PiiKind {
    /// Its name, in findings and moderation results.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Email => "email",
            Self::Phone => "phone",
            Self::CreditCard => "credit_card",
            Self::Iban => "iban",
            Self::UsSsn => "us_ssn",
            Self::UkNino => "uk_nino",
            Self::IpAddress => "ip_address",
            Self::Secret => "secret",
            Self::Address => "address",
            Self::PersonName => "person_name",
        }
    }

    /// Its placeholder stem: `EMAIL` for `<EMAIL_1>`.
    pub fn placeholder(self) -> &'static str {
        match self {
            Self::Email => "EMAIL",
            Self::Phone => "PHONE",
            Self::CreditCard => "CARD",
            Self::Iban => "IBAN",
            Self::UsSsn => "SSN",
            Self::UkNino => "NINO",
            Self::IpAddress => "IP",
            Self::Secret => "SECRET",
            Self::Address => "ADDRESS",
            Self::PersonName => "NAME",
        }
    }

    /// Every kind.
    pub const ALL: [PiiKind; 10] = [
        Self::Email,
        Self::Phone,
        Self::CreditCard,
        Self::Iban,
        Self::UsSsn,
        Self::UkNino,
        Self::IpAddress,
        Self::Secret,
        Self::Address,
        Self::PersonName,
    ];

    /// The kind named `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == name)
    }

    /// Whether the format has a check (a checksum, ranges, a parser), as opposed to a pattern
    /// alone: the detectors measured against the strict targets.
    pub fn is_checkable(self) -> bool {
        !matches!(self, Self::Address | Self::PersonName)
    }
}

/// One piece of PII found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PiiMatch {
    /// What it is.
    pub kind: PiiKind,
    /// Where, in characters.
    pub span: Span,
    /// Score of the detector: 1 for checked formats, less for patterns alone.
    #[serde(skip)]
    pub score_pct: u8,
}

struct Detector {
    kind: PiiKind,
    pattern: Regex,
    /// Which capture group is the PII (0: the whole match).
    group: usize,
    check: fn(&str) -> bool,
    score_pct: u8,
}

fn detector(kind: PiiKind, pattern: &str, check: fn(&str) -> bool, score_pct: u8) -> Detector {
    Detector {
        kind,
        pattern: Regex::new(&crate::injection::ascii_boundaries(pattern))
            .expect("a valid PII pattern"),
        group: 0,
        check,
        score_pct,
    }
}

static DETECTORS: LazyLock<Vec<Detector>> = LazyLock::new(|| {
    let any = |_: &str| true;
    vec![
        detector(
            PiiKind::Secret,
            r"-----BEGIN (?:RSA |EC |DSA |OPENSSH |PGP )?PRIVATE KEY(?: BLOCK)?-----[\s\S]*?-----END (?:RSA |EC |DSA |OPENSSH |PGP )?PRIVATE KEY(?: BLOCK)?-----",
            any,
            100,
        ),
        detector(
            PiiKind::Secret,
            r"\b(?:sk-(?:proj-|ant-(?:api\d\d-)?)?[A-Za-z0-9_\-]{20,}|gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{40,}|AKIA[0-9A-Z]{16}|ASIA[0-9A-Z]{16}|xox[abposr]-[A-Za-z0-9\-]{10,}|AIza[0-9A-Za-z_\-]{35}|(?:sk|rk|pk)_(?:live|test)_[0-9A-Za-z]{16,}|glpat-[0-9A-Za-z_\-]{20}|hf_[A-Za-z0-9]{30,}|npm_[A-Za-z0-9]{36}|eyJ[A-Za-z0-9_\-]{10,}\.eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,})",
            any,
            100,
        ),
        Detector {
            group: 1,
            ..detector(
                PiiKind::Secret,
                r#"(?i)\b(?:api[_\- ]?key|secret(?:[_\- ]?key)?|access[_\- ]?token|auth[_\- ]?token|token|password|passwd|pwd|client[_\- ]?secret)\b["']?\s*[:=]\s*["']?([A-Za-z0-9/+_\-\.!@#$%^&*]{12,})"#,
                high_entropy,
                90,
            )
        },
        detector(
            PiiKind::Email,
            // Unbounded runs, lengths checked after: a bounded repetition of `\w` (Unicode)
            // blew up the lazy DFA, and the slow engine it fell back to cost 0.2 ms a prompt.
            r"\b\w(?:[\w.%+\-]*[\w%+\-])?@(?:[A-Za-z0-9](?:[A-Za-z0-9\-]*[A-Za-z0-9])?\.)+[A-Za-z]{2,24}\b",
            is_email,
            100,
        ),
        detector(
            PiiKind::CreditCard,
            r"\b\d(?:[ \-]?\d){12,18}\b",
            is_card,
            100,
        ),
        detector(
            PiiKind::Iban,
            r"\b[A-Z]{2}\d{2}(?:[ ]?[A-Z0-9]){11,30}\b",
            is_iban,
            100,
        ),
        detector(PiiKind::UsSsn, r"\b\d{3}-\d{2}-\d{4}\b", is_ssn, 95),
        detector(
            PiiKind::UkNino,
            r"\b[A-CEGHJ-PR-TW-Z][A-CEGHJ-NPR-TW-Z] ?\d{2} ?\d{2} ?\d{2} ?[A-D]\b",
            is_nino,
            95,
        ),
        detector(
            PiiKind::IpAddress,
            r"\b(?:\d{1,3}\.){3}\d{1,3}\b",
            is_ipv4,
            95,
        ),
        // Every run of letters, digits, dots and at least two colons is a candidate, whole: so
        // `Foo::Bar` (a Perl module) or `12:30:00` fails the parser instead of yielding `::Ba`.
        detector(
            PiiKind::IpAddress,
            r"[0-9A-Za-z.]*:[0-9A-Za-z.]*:[0-9A-Za-z.:]*[0-9A-Za-z]",
            is_ipv6,
            95,
        ),
        detector(
            PiiKind::Phone,
            r"(?:\+|\b00)[1-9]\d{0,2}[ .\-]?(?:\(\d{1,4}\)[ .\-]?)?\d{1,4}(?:[ .\-]?\d{2,4}){1,4}\b",
            is_international_phone,
            95,
        ),
        detector(
            PiiKind::Phone,
            r"(?:\(\d{3}\) ?|\b\d{3}[ .\-])\d{3}[ .\-]\d{4}\b",
            is_nanp,
            90,
        ),
        detector(
            PiiKind::Address,
            r"\b\d{1,5}[A-Za-z]? (?:[A-Z][a-z]+\.? ){1,4}(?:Street|St|Avenue|Ave|Road|Rd|Boulevard|Blvd|Lane|Ln|Drive|Dr|Court|Ct|Way|Place|Pl|Terrace|Square|Sq|Close|Crescent|Parkway|Pkwy|Highway|Hwy)\b\.?(?:,? (?:Apt|Suite|Unit|Flat) ?#?\w+)?",
            any,
            80,
        ),
        Detector {
            group: 1,
            ..detector(
                PiiKind::PersonName,
                r"(?:\b(?:Mr|Mrs|Ms|Miss|Dr|Prof|Sir|Dame)\.? |\b(?:[Mm]y name is|I am|I'm|[Nn]amed|[Cc]alled) )([A-Z][a-z]+(?:[ \-][A-Z][a-z]+){0,2})\b",
                not_a_common_word,
                70,
            )
        },
    ]
});

/// Every piece of PII in `text`, in order; overlapping finds keep the longest.
pub fn find(text: &str) -> Vec<PiiMatch> {
    let mut found: Vec<(usize, usize, PiiKind, u8)> = Vec::new();
    for d in DETECTORS.iter() {
        // A whole-match detector needs no capture engine: `find_iter` stays in the DFA.
        let matches: Box<dyn Iterator<Item = regex::Match>> = match d.group {
            0 => Box::new(d.pattern.find_iter(text)),
            g => Box::new(d.pattern.captures_iter(text).filter_map(move |c| c.get(g))),
        };
        for m in matches {
            if (d.check)(m.as_str()) {
                found.push((m.start(), m.end(), d.kind, d.score_pct));
            }
        }
    }
    // Longest first, then earliest detector: each kept find claims its bytes.
    found.sort_by_key(|&(s, e, _, _)| std::cmp::Reverse(e - s));
    let mut kept: Vec<(usize, usize, PiiKind, u8)> = Vec::new();
    for f in found {
        if kept.iter().all(|k| f.1 <= k.0 || f.0 >= k.1) {
            kept.push(f);
        }
    }
    kept.sort_by_key(|k| k.0);
    let chars = CharIndex::new(text);
    kept.into_iter()
        .map(|(s, e, kind, score_pct)| PiiMatch {
            kind,
            span: Span {
                start: chars.of(s),
                end: chars.of(e),
            },
            score_pct,
        })
        .collect()
}

/// Byte offsets to character offsets.
struct CharIndex(Vec<usize>);

impl CharIndex {
    fn new(text: &str) -> Self {
        Self(text.char_indices().map(|(b, _)| b).collect())
    }

    fn of(&self, byte: usize) -> usize {
        self.0.partition_point(|&b| b < byte)
    }
}

/// The PII detectors, as a guard.
#[derive(Clone, Copy, Debug, Default)]
pub struct PiiDetector;

impl Guard for PiiDetector {
    fn name(&self) -> &'static str {
        "pii"
    }

    fn check(&self, text: &str, _source: Source) -> Vec<Finding> {
        find(text)
            .into_iter()
            .map(|m| Finding {
                category: Category::Pii,
                rule: m.kind.as_str(),
                score: f32::from(m.score_pct) / 100.0,
                span: Some(m.span),
            })
            .collect()
    }
}

fn digits(s: &str) -> Vec<u32> {
    s.chars().filter_map(|c| c.to_digit(10)).collect()
}

/// The Luhn checksum holds.
pub fn luhn(digits: &[u32]) -> bool {
    let sum: u32 = (digits.iter().rev().enumerate())
        .map(|(i, &d)| match i % 2 {
            1 => (d * 2) / 10 + (d * 2) % 10,
            _ => d,
        })
        .sum();
    !digits.is_empty() && sum.is_multiple_of(10)
}

fn is_card(s: &str) -> bool {
    let d = digits(s);
    let prefix = |n: usize| d.iter().take(n).fold(0u32, |a, &x| a * 10 + x);
    let issuer = match d.len() {
        13..=19 => {
            d[0] == 4
                || (51..=55).contains(&prefix(2))
                || (2221..=2720).contains(&prefix(4))
                || matches!(prefix(2), 34 | 37 | 36 | 38 | 30 | 35 | 62 | 65)
                || prefix(4) == 6011
        }
        _ => false,
    };
    // Groups, if any, are of four (Amex: 4-6-5).
    issuer && luhn(&d)
}

/// IBAN lengths by country.
fn iban_length(country: &str) -> Option<usize> {
    Some(match country {
        "NO" => 15,
        "BE" => 16,
        "DK" | "FI" | "FO" | "GL" | "NL" => 18,
        "MK" | "SI" => 19,
        "AT" | "BA" | "EE" | "KZ" | "LT" | "LU" | "XK" => 20,
        "CH" | "CR" | "HR" | "LI" | "LV" => 21,
        "BG" | "BH" | "DE" | "GB" | "GE" | "IE" | "ME" | "RS" => 22,
        "AE" | "GI" | "IL" | "TL" => 23,
        "AD" | "CZ" | "ES" | "MD" | "PK" | "RO" | "SA" | "SE" | "SK" | "TN" | "VG" => 24,
        "PT" | "ST" => 25,
        "IS" | "TR" => 26,
        "FR" | "GR" | "IT" | "MC" | "MR" | "SM" => 27,
        "AL" | "AZ" | "BY" | "CY" | "DO" | "GT" | "HU" | "LB" | "PL" => 28,
        "BR" | "EG" | "PS" | "QA" | "UA" => 29,
        "JO" | "KW" | "MU" => 30,
        "MT" | "SC" => 31,
        "LC" => 32,
        _ => return None,
    })
}

fn is_iban(s: &str) -> bool {
    let compact: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    if iban_length(&compact[..2]) != Some(compact.len()) {
        return false;
    }
    let rearranged = compact[4..].chars().chain(compact[..4].chars());
    let mut rem = 0u32;
    for c in rearranged {
        let v = match c.to_digit(36) {
            Some(v) => v,
            None => return false,
        };
        rem = if v >= 10 {
            (rem * 100 + v) % 97
        } else {
            (rem * 10 + v) % 97
        };
    }
    rem == 1
}

fn is_ssn(s: &str) -> bool {
    let d = digits(s);
    let area = d[0] * 100 + d[1] * 10 + d[2];
    let group = d[3] * 10 + d[4];
    let serial = d[5..].iter().fold(0, |a, &x| a * 10 + x);
    area != 0 && area != 666 && area < 900 && group != 0 && serial != 0
}

fn is_nino(s: &str) -> bool {
    let prefix: String = s.chars().take(2).collect();
    !matches!(
        prefix.as_str(),
        "BG" | "GB" | "NK" | "KN" | "TN" | "NT" | "ZZ"
    )
}

/// An address's parts within their limits: a local part of at most 64 bytes, domain labels of
/// at most 63.
fn is_email(s: &str) -> bool {
    s.split_once('@').is_some_and(|(local, domain)| {
        local.len() <= 64 && domain.split('.').all(|label| label.len() <= 63)
    })
}

fn is_ipv4(s: &str) -> bool {
    let octets: Vec<&str> = s.split('.').collect();
    let valid = octets
        .iter()
        .all(|o| o.parse::<u8>().is_ok() && (o.len() == 1 || !o.starts_with('0')));
    // 1.2.3.4-style version numbers are rarely addresses; 0.x.x.x neither.
    valid && !s.starts_with("0.")
}

fn is_ipv6(s: &str) -> bool {
    (s.contains("::") || s.matches(':').count() == 7) && s.parse::<std::net::Ipv6Addr>().is_ok()
}

fn is_international_phone(s: &str) -> bool {
    let n = digits(s).len() - usize::from(s.starts_with("00")) * 2;
    // E.164: at most 15 digits; real numbers have at least 8 with the country code.
    (8..=15).contains(&n)
}

fn is_nanp(s: &str) -> bool {
    let d = digits(s);
    // Area and exchange codes start with 2-9.
    d.len() == 10 && d[0] >= 2 && d[3] >= 2
}

fn high_entropy(s: &str) -> bool {
    let n = s.chars().count() as f64;
    let mut counts = std::collections::HashMap::new();
    for c in s.chars() {
        *counts.entry(c).or_insert(0usize) += 1;
    }
    let entropy: f64 = counts
        .values()
        .map(|&k| {
            let p = k as f64 / n;
            -p * p.log2()
        })
        .sum();
    let classes = [
        s.chars().any(|c| c.is_ascii_lowercase()),
        s.chars().any(|c| c.is_ascii_uppercase()),
        s.chars().any(|c| c.is_ascii_digit()),
    ];
    entropy >= 3.0 && classes.iter().filter(|&&c| c).count() >= 2
}

fn not_a_common_word(s: &str) -> bool {
    const NOT_NAMES: &[&str] = &[
        "The",
        "This",
        "That",
        "Here",
        "There",
        "Sorry",
        "Happy",
        "Glad",
        "Not",
        "Just",
        "Very",
        "So",
        "Going",
        "Looking",
        "Trying",
        "Working",
        "Interested",
        "Sure",
        "Fine",
        "Good",
        "Using",
        "Writing",
        "Asking",
        "Unable",
        "New",
        "Back",
        "Done",
        "Ready",
        "Also",
        "Still",
    ];
    let first = s.split([' ', '-']).next().unwrap_or("");
    !NOT_NAMES.contains(&first)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(text: &str) -> Vec<(PiiKind, String)> {
        let chars: Vec<char> = text.chars().collect();
        find(text)
            .into_iter()
            .map(|m| (m.kind, chars[m.span.start..m.span.end].iter().collect()))
            .collect()
    }

    fn one(text: &str, kind: PiiKind, want: &str) {
        let found = kinds(text);
        assert!(
            found.iter().any(|(k, s)| *k == kind && s == want),
            "{text}: {found:?}"
        );
    }

    #[test]
    fn checkable_formats_are_found_in_their_variants() {
        one(
            "Mail jane.doe+tag@example.co.uk today",
            PiiKind::Email,
            "jane.doe+tag@example.co.uk",
        );
        one(
            "Card 4111 1111 1111 1111 exp 12/29",
            PiiKind::CreditCard,
            "4111 1111 1111 1111",
        );
        one(
            "amex 3782-822463-10005",
            PiiKind::CreditCard,
            "3782-822463-10005",
        );
        one(
            "IBAN GB82 WEST 1234 5698 7654 32.",
            PiiKind::Iban,
            "GB82 WEST 1234 5698 7654 32",
        );
        one(
            "DE89370400440532013000",
            PiiKind::Iban,
            "DE89370400440532013000",
        );
        one("SSN: 123-45-6789", PiiKind::UsSsn, "123-45-6789");
        one("NI number AB 12 34 56 C", PiiKind::UkNino, "AB 12 34 56 C");
        one(
            "ssh to 192.168.10.4 now",
            PiiKind::IpAddress,
            "192.168.10.4",
        );
        one(
            "v6 2001:db8::8a2e:370:7334 up",
            PiiKind::IpAddress,
            "2001:db8::8a2e:370:7334",
        );
        one("call +44 20 7946 0958", PiiKind::Phone, "+44 20 7946 0958");
        one("call +1-202-555-0143", PiiKind::Phone, "+1-202-555-0143");
        one("or (415) 555-2671", PiiKind::Phone, "(415) 555-2671");
        one("Tel. 0049 30 1234567", PiiKind::Phone, "0049 30 1234567");
        one(
            "key sk-proj-abcdefghijklmnopqrstuvwxyz012345",
            PiiKind::Secret,
            "sk-proj-abcdefghijklmnopqrstuvwxyz012345",
        );
        one(
            "AWS AKIAIOSFODNN7EXAMPLE",
            PiiKind::Secret,
            "AKIAIOSFODNN7EXAMPLE",
        );
        one(
            "password = \"Tr0ub4dor&3xK9q\"",
            PiiKind::Secret,
            "Tr0ub4dor&3xK9q",
        );
        one(
            "I live at 221B Baker Street, London",
            PiiKind::Address,
            "221B Baker Street",
        );
        one(
            "Please ask Dr. Maria Lopez",
            PiiKind::PersonName,
            "Maria Lopez",
        );
    }

    #[test]
    fn look_alikes_fail_their_checks() {
        for text in [
            "Order 4111 1111 1111 1112 shipped",                // Luhn fails
            "GB82 WEST 1234 5698 7654 33",                      // mod 97 fails
            "SSN 000-12-3456 or 666-12-3456",                   // never allocated
            "version 1.2.300.4",                                // an octet over 255
            "ratio 10:20:30",                                   // not an address
            "see Locale::Maketext::Simple and File::Spec::Deb", // Perl modules
            "It is 2024-01-15 12:30:00",                        // a date and a time
            "password = \"aaaaaaaaaaaaaaaa\"",                  // no entropy
            "ISBN 978-3-16-148410-0",
            "Use 1234 5678 9012 3456 as the example id", // starts like no card
        ] {
            assert!(kinds(text).is_empty(), "{text}: {:?}", kinds(text));
        }
    }

    #[test]
    fn ipv6_candidates_are_whole_tokens() {
        one("loopback ::1.", PiiKind::IpAddress, "::1");
        one(
            "peer fe80::1ff:fe23:4567:890a",
            PiiKind::IpAddress,
            "fe80::1ff:fe23:4567:890a",
        );
    }

    #[test]
    fn spans_are_characters_not_bytes() {
        let text = "Grüße an jörg@example.de";
        let m = &find(text)[0];
        let chars: Vec<char> = text.chars().collect();
        let found: String = chars[m.span.start..m.span.end].iter().collect();
        assert_eq!(found, "jörg@example.de");
    }

    #[test]
    fn overlaps_keep_the_longest() {
        // The digits of an IBAN are not also a phone number.
        let found = kinds("Pay to DE89 3704 0044 0532 0130 00 please");
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, PiiKind::Iban);
    }
}
