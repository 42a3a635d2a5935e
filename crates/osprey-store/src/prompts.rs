//! The prompt registry's records: immutable, numbered versions of each named prompt, and labels
//! (`production`, `staging`, ...) that point at one version or split traffic between several
//! by weight. A label's changes stack, so [`Store::rollback_label`] returns it to what it was
//! before its last change. What a version holds (template, settings) is the caller's JSON.

use crate::{Result, Store, StoreError, now_ms};

/// One version of a prompt.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct PromptVersion {
    /// The prompt's name.
    pub name: String,
    /// 1, 2, ...
    pub version: i64,
    /// Its definition, JSON.
    pub body: String,
    /// When it was pushed, Unix ms.
    pub created_at: i64,
}

/// A label's assignment: `(version, weight)` pairs (one pair with any weight: that version).
pub type Split = Vec<(i64, u32)>;

/// A prompt in a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PromptSummary {
    /// Its name.
    pub name: String,
    /// Its newest version.
    pub latest: i64,
    /// Its labels and what each points at.
    pub labels: Vec<(String, Split)>,
}

impl Store {
    /// Stores `body` as the next version of prompt `name`; returns it.
    pub async fn push_prompt(&self, name: &str, body: &str) -> Result<PromptVersion> {
        // Two pushes at once may pick the same number: the loser's insert fails on the key
        // and takes the next one.
        for _ in 0..5 {
            let (latest,): (i64,) = sqlx::query_as(
                "SELECT COALESCE(MAX(version), 0) FROM prompt_versions WHERE name = $1",
            )
            .bind(name)
            .fetch_one(&self.pool)
            .await?;
            let version = PromptVersion {
                name: name.to_owned(),
                version: latest + 1,
                body: body.to_owned(),
                created_at: now_ms(),
            };
            let inserted = sqlx::query(
                "INSERT INTO prompt_versions (name, version, body, created_at) \
                 VALUES ($1, $2, $3, $4)",
            )
            .bind(&version.name)
            .bind(version.version)
            .bind(&version.body)
            .bind(version.created_at)
            .execute(&self.pool)
            .await;
            match inserted {
                Ok(_) => return Ok(version),
                Err(sqlx::Error::Database(e)) if e.is_unique_violation() => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(StoreError::Database(sqlx::Error::Protocol(
            "too many concurrent pushes of one prompt".into(),
        )))
    }

    /// Version `version` of prompt `name`.
    pub async fn prompt_version(&self, name: &str, version: i64) -> Result<PromptVersion> {
        sqlx::query_as(
            "SELECT name, version, body, created_at FROM prompt_versions \
             WHERE name = $1 AND version = $2",
        )
        .bind(name)
        .bind(version)
        .fetch_optional(&self.pool)
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("prompt {name} version {version}")))
    }

    /// Every version of prompt `name`, oldest first.
    pub async fn prompt_versions(&self, name: &str) -> Result<Vec<PromptVersion>> {
        Ok(sqlx::query_as(
            "SELECT name, version, body, created_at FROM prompt_versions \
             WHERE name = $1 ORDER BY version",
        )
        .bind(name)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Every prompt with its newest version and its labels, by name.
    pub async fn list_prompts(&self) -> Result<Vec<PromptSummary>> {
        let names: Vec<(String, i64)> = sqlx::query_as(
            "SELECT name, MAX(version) FROM prompt_versions GROUP BY name ORDER BY name",
        )
        .fetch_all(&self.pool)
        .await?;
        let mut out = Vec::with_capacity(names.len());
        for (name, latest) in names {
            let labels = self.labels(&name).await?;
            out.push(PromptSummary {
                name,
                latest,
                labels,
            });
        }
        Ok(out)
    }

    /// The labels of prompt `name` and what each points at now.
    pub async fn labels(&self, name: &str) -> Result<Vec<(String, Split)>> {
        let rows: Vec<(String, String)> = sqlx::query_as(
            "SELECT c.label, c.split FROM prompt_label_changes c \
             WHERE c.name = $1 AND c.seq = (SELECT MAX(seq) FROM prompt_label_changes \
             WHERE name = c.name AND label = c.label) ORDER BY c.label",
        )
        .bind(name)
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|(label, split)| Ok((label, parse_split(&split)?)))
            .collect()
    }

    /// What label `label` of prompt `name` points at.
    pub async fn label(&self, name: &str, label: &str) -> Result<Split> {
        let row: Option<(String,)> = sqlx::query_as(
            "SELECT split FROM prompt_label_changes WHERE name = $1 AND label = $2 \
             ORDER BY seq DESC LIMIT 1",
        )
        .bind(name)
        .bind(label)
        .fetch_optional(&self.pool)
        .await?;
        match row {
            Some((split,)) => parse_split(&split),
            None => Err(StoreError::NotFound(format!("prompt {name} label {label}"))),
        }
    }

    /// Points label `label` of prompt `name` at `split`, whose versions must exist.
    pub async fn set_label(&self, name: &str, label: &str, split: &Split) -> Result<()> {
        for (version, _) in split {
            self.prompt_version(name, *version).await?;
        }
        let text = serde_json::to_string(split).expect("JSON serialises");
        sqlx::query(
            "INSERT INTO prompt_label_changes (name, label, split, created_at) \
             VALUES ($1, $2, $3, $4)",
        )
        .bind(name)
        .bind(label)
        .bind(text)
        .bind(now_ms())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Undoes the last change of label `label`; returns what it points at now. A label with
    /// only one change cannot be rolled back.
    pub async fn rollback_label(&self, name: &str, label: &str) -> Result<Split> {
        let changes: Vec<(i64,)> = sqlx::query_as(
            "SELECT seq FROM prompt_label_changes WHERE name = $1 AND label = $2 \
             ORDER BY seq DESC LIMIT 2",
        )
        .bind(name)
        .bind(label)
        .fetch_all(&self.pool)
        .await?;
        if changes.len() < 2 {
            return Err(StoreError::NotFound(format!(
                "an earlier assignment of prompt {name} label {label}"
            )));
        }
        sqlx::query("DELETE FROM prompt_label_changes WHERE seq = $1")
            .bind(changes[0].0)
            .execute(&self.pool)
            .await?;
        self.label(name, label).await
    }
}

fn parse_split(text: &str) -> Result<Split> {
    serde_json::from_str(text).map_err(|e| {
        StoreError::Database(sqlx::Error::Decode(
            format!("a label's split `{text}`: {e}").into(),
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn versions_are_numbered_and_labels_roll_back() {
        for store in crate::testing::stores().await {
            numbered_and_rolled_back(&store).await;
        }
    }

    async fn numbered_and_rolled_back(s: &Store) {
        let v1 = s.push_prompt("support", r#"{"v":1}"#).await.unwrap();
        let v2 = s.push_prompt("support", r#"{"v":2}"#).await.unwrap();
        assert_eq!((v1.version, v2.version), (1, 2));
        assert_eq!(s.push_prompt("other", "{}").await.unwrap().version, 1);
        assert_eq!(
            s.prompt_version("support", 1).await.unwrap().body,
            r#"{"v":1}"#
        );
        assert!(s.prompt_version("support", 3).await.is_err());
        assert!(
            s.set_label("support", "production", &vec![(9, 1)])
                .await
                .is_err()
        );
        s.set_label("support", "production", &vec![(1, 1)])
            .await
            .unwrap();
        s.set_label("support", "production", &vec![(1, 90), (2, 10)])
            .await
            .unwrap();
        assert_eq!(
            s.label("support", "production").await.unwrap(),
            vec![(1, 90), (2, 10)]
        );
        let listed = s.list_prompts().await.unwrap();
        assert_eq!(listed.len(), 2);
        assert_eq!((listed[1].name.as_str(), listed[1].latest), ("support", 2));
        assert_eq!(listed[1].labels[0].0, "production");
        assert_eq!(
            s.rollback_label("support", "production").await.unwrap(),
            vec![(1, 1)]
        );
        assert!(s.rollback_label("support", "production").await.is_err());
        assert!(s.label("support", "staging").await.is_err());
    }
}
