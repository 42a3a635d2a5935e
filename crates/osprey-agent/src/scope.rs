//! Least privilege: what a tool may touch ([`Scope`]), declared by each tool, and granted to
//! a tenant or key as a [`Scopes`] set. A call needs every scope its tool declares.

use std::fmt;

use serde::{Deserialize, Serialize};

/// One kind of power a tool has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Reads data the caller can see (documents, a database, files).
    Read,
    /// Changes data.
    Write,
    /// Reaches other hosts.
    Network,
    /// Can destroy or irreversibly change something; a call always waits for approval.
    Destructive,
}

impl Scope {
    /// Every scope.
    pub const ALL: [Scope; 4] = [
        Scope::Read,
        Scope::Write,
        Scope::Network,
        Scope::Destructive,
    ];

    /// Its name (`read`, `write`, `network`, `destructive`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::Network => "network",
            Self::Destructive => "destructive",
        }
    }

    /// The scope named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == name.trim())
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// A set of scopes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Scopes(u8);

impl Scopes {
    /// No scope: pure computation only.
    pub const NONE: Scopes = Scopes(0);

    /// The set of `scopes`.
    pub fn of(scopes: &[Scope]) -> Self {
        Self(scopes.iter().fold(0, |b, s| b | s.bit()))
    }

    /// Parses names (`"read, network"` or a list); an unknown name is an error naming it.
    pub fn parse<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<Self, String> {
        let mut set = Self::NONE;
        for name in names.into_iter().flat_map(|n| n.split(',')) {
            let name = name.trim();
            if name.is_empty() {
                continue;
            }
            let scope = Scope::parse(name).ok_or_else(|| {
                format!("unknown scope `{name}` (known: read, write, network, destructive)")
            })?;
            set = set.with(scope);
        }
        Ok(set)
    }

    /// This set and `scope`.
    pub fn with(self, scope: Scope) -> Self {
        Self(self.0 | scope.bit())
    }

    /// Whether `scope` is in the set.
    pub fn contains(self, scope: Scope) -> bool {
        self.0 & scope.bit() != 0
    }

    /// The scopes of `needed` this set lacks.
    pub fn missing(self, needed: Scopes) -> Vec<Scope> {
        needed.iter().filter(|s| !self.contains(*s)).collect()
    }

    /// Both sets' scopes in common.
    pub fn intersect(self, other: Scopes) -> Self {
        Self(self.0 & other.0)
    }

    /// The scopes, in order.
    pub fn iter(self) -> impl Iterator<Item = Scope> {
        Scope::ALL.into_iter().filter(move |s| self.contains(*s))
    }

    /// The names, in order.
    pub fn names(self) -> Vec<&'static str> {
        self.iter().map(Scope::as_str).collect()
    }
}

impl fmt::Display for Scopes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.names().join(","))
    }
}

impl Serialize for Scopes {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.names().serialize(s)
    }
}

impl<'de> Deserialize<'de> for Scopes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let names = Vec::<String>::deserialize(d)?;
        Scopes::parse(names.iter().map(String::as_str)).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_parse_compare_and_print() {
        let granted = Scopes::parse(["read, network"]).unwrap();
        assert!(granted.contains(Scope::Read) && !granted.contains(Scope::Write));
        let needed = Scopes::of(&[Scope::Read, Scope::Write, Scope::Destructive]);
        assert_eq!(
            granted.missing(needed),
            vec![Scope::Write, Scope::Destructive]
        );
        assert!(granted.missing(Scopes::NONE).is_empty());
        assert_eq!(granted.to_string(), "read,network");
        assert!(Scopes::parse(["reed"]).unwrap_err().contains("`reed`"));
        let json: Scopes = serde_json::from_str(r#"["write"]"#).unwrap();
        assert_eq!(json, Scopes::of(&[Scope::Write]));
        assert_eq!(granted.intersect(json), Scopes::NONE);
    }
}
