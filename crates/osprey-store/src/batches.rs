//! Files and batches of the OpenAI Batch API: uploaded JSONL, the batches made from them, and
//! their output files. Everything is per tenant: a tenant never reads another's file or batch.

use crate::keys::random_hex;
use crate::{Result, Store, StoreError, now_ms};

/// A stored file (without its content).
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct FileRecord {
    /// `file-…`.
    pub id: String,
    /// Its owner.
    pub tenant: String,
    /// The name it was uploaded with.
    pub filename: String,
    /// `batch` (input) or `batch_output`.
    pub purpose: String,
    /// Its size.
    pub bytes: i64,
    /// Upload time, Unix ms.
    pub created_at: i64,
}

/// A batch.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct BatchRecord {
    /// `batch_…`.
    pub id: String,
    /// Its owner.
    pub tenant: String,
    /// `/v1/chat/completions` or `/v1/completions`.
    pub endpoint: String,
    /// The JSONL of requests.
    pub input_file_id: String,
    /// As asked (`24h`).
    pub completion_window: String,
    /// `in_progress`, `completed`, `cancelling`, `cancelled` or `failed`.
    pub status: String,
    /// The JSONL of results, once completed.
    pub output_file_id: Option<String>,
    /// Creation time, Unix ms.
    pub created_at: i64,
    /// Completion time, Unix ms.
    pub completed_at: Option<i64>,
    /// Requests in the input.
    pub total: i64,
    /// Requests answered (successfully or not) so far.
    pub completed: i64,
    /// Of those, requests that failed.
    pub failed: i64,
}

macro_rules! batch_columns {
    () => {
        "id, tenant, endpoint, input_file_id, completion_window, status, output_file_id, \
         created_at, completed_at, total, completed, failed"
    };
}

impl Store {
    /// Stores a file of `tenant`.
    pub async fn create_file(
        &self,
        tenant: &str,
        filename: &str,
        purpose: &str,
        content: &[u8],
    ) -> Result<FileRecord> {
        let file = FileRecord {
            id: format!("file-{}", random_hex(12)),
            tenant: tenant.to_owned(),
            filename: filename.to_owned(),
            purpose: purpose.to_owned(),
            bytes: content.len() as i64,
            created_at: now_ms(),
        };
        sqlx::query(
            "INSERT INTO files (id, tenant, filename, purpose, bytes, created_at, content) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(&file.id)
        .bind(&file.tenant)
        .bind(&file.filename)
        .bind(&file.purpose)
        .bind(file.bytes)
        .bind(file.created_at)
        .bind(content)
        .execute(&self.pool)
        .await?;
        Ok(file)
    }

    /// File `id` of `tenant`.
    pub async fn file(&self, tenant: &str, id: &str) -> Result<FileRecord> {
        sqlx::query_as(
            "SELECT id, tenant, filename, purpose, bytes, created_at FROM files \
             WHERE id = $1 AND tenant = $2",
        )
        .bind(id)
        .bind(tenant)
        .fetch_optional(&self.pool)
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("file {id}")))
    }

    /// The content of file `id` of `tenant`.
    pub async fn file_content(&self, tenant: &str, id: &str) -> Result<Vec<u8>> {
        sqlx::query_scalar("SELECT content FROM files WHERE id = $1 AND tenant = $2")
            .bind(id)
            .bind(tenant)
            .fetch_optional(&self.pool)
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("file {id}")))
    }

    /// A new batch of `tenant`, in progress, over `total` requests.
    pub async fn create_batch(
        &self,
        tenant: &str,
        endpoint: &str,
        input_file_id: &str,
        completion_window: &str,
        total: i64,
    ) -> Result<BatchRecord> {
        let batch = BatchRecord {
            id: format!("batch_{}", random_hex(12)),
            tenant: tenant.to_owned(),
            endpoint: endpoint.to_owned(),
            input_file_id: input_file_id.to_owned(),
            completion_window: completion_window.to_owned(),
            status: "in_progress".into(),
            output_file_id: None,
            created_at: now_ms(),
            completed_at: None,
            total,
            completed: 0,
            failed: 0,
        };
        sqlx::query(concat!(
            "INSERT INTO batches (",
            batch_columns!(),
            ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
        ))
        .bind(&batch.id)
        .bind(&batch.tenant)
        .bind(&batch.endpoint)
        .bind(&batch.input_file_id)
        .bind(&batch.completion_window)
        .bind(&batch.status)
        .bind(&batch.output_file_id)
        .bind(batch.created_at)
        .bind(batch.completed_at)
        .bind(batch.total)
        .bind(batch.completed)
        .bind(batch.failed)
        .execute(&self.pool)
        .await?;
        Ok(batch)
    }

    /// Batch `id` of `tenant`.
    pub async fn batch(&self, tenant: &str, id: &str) -> Result<BatchRecord> {
        sqlx::query_as(concat!(
            "SELECT ",
            batch_columns!(),
            " FROM batches WHERE id = $1 AND tenant = $2"
        ))
        .bind(id)
        .bind(tenant)
        .fetch_optional(&self.pool)
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("batch {id}")))
    }

    /// The batches of `tenant`, newest first.
    pub async fn list_batches(&self, tenant: &str) -> Result<Vec<BatchRecord>> {
        Ok(sqlx::query_as(concat!(
            "SELECT ",
            batch_columns!(),
            " FROM batches WHERE tenant = $1 ORDER BY created_at DESC, id"
        ))
        .bind(tenant)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Batches still to run (in progress or being cancelled), oldest first: after a restart,
    /// these are resumed.
    pub async fn unfinished_batches(&self) -> Result<Vec<BatchRecord>> {
        Ok(sqlx::query_as(concat!(
            "SELECT ",
            batch_columns!(),
            " FROM batches WHERE status IN ('in_progress', 'cancelling') \
             ORDER BY created_at, id"
        ))
        .fetch_all(&self.pool)
        .await?)
    }

    /// Records progress: `completed` answered so far, `failed` of them failed.
    pub async fn batch_progress(&self, id: &str, completed: i64, failed: i64) -> Result<()> {
        sqlx::query("UPDATE batches SET completed = $1, failed = $2 WHERE id = $3")
            .bind(completed)
            .bind(failed)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Ends batch `id` with `status` and its output file.
    pub async fn finish_batch(
        &self,
        id: &str,
        status: &str,
        output_file_id: Option<&str>,
    ) -> Result<()> {
        sqlx::query(
            "UPDATE batches SET status = $1, output_file_id = $2, completed_at = $3 WHERE id = $4",
        )
        .bind(status)
        .bind(output_file_id)
        .bind(now_ms())
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Asks batch `id` of `tenant` to stop (it is `cancelling` until its runner stops).
    pub async fn cancel_batch(&self, tenant: &str, id: &str) -> Result<BatchRecord> {
        sqlx::query(
            "UPDATE batches SET status = 'cancelling' \
             WHERE id = $1 AND tenant = $2 AND status = 'in_progress'",
        )
        .bind(id)
        .bind(tenant)
        .execute(&self.pool)
        .await?;
        self.batch(tenant, id).await
    }

    /// The status of batch `id` (for a runner checking for cancellation).
    pub async fn batch_status(&self, id: &str) -> Result<String> {
        sqlx::query_scalar("SELECT status FROM batches WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("batch {id}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn files_and_batches_belong_to_their_tenant() {
        for s in crate::testing::stores().await {
            files_and_batches(&s).await;
        }
    }

    async fn files_and_batches(s: &Store) {
        let f = s
            .create_file("acme", "in.jsonl", "batch", b"{}\n")
            .await
            .unwrap();
        assert_eq!(s.file_content("acme", &f.id).await.unwrap(), b"{}\n");
        assert!(matches!(
            s.file("globex", &f.id).await,
            Err(StoreError::NotFound(_))
        ));
        let b = s
            .create_batch("acme", "/v1/completions", &f.id, "24h", 1)
            .await
            .unwrap();
        assert!(s.batch("globex", &b.id).await.is_err());
        assert_eq!(s.unfinished_batches().await.unwrap(), vec![b.clone()]);
        assert_eq!(
            s.cancel_batch("acme", &b.id).await.unwrap().status,
            "cancelling"
        );
        s.batch_progress(&b.id, 1, 0).await.unwrap();
        s.finish_batch(&b.id, "cancelled", None).await.unwrap();
        let done = s.batch("acme", &b.id).await.unwrap();
        assert_eq!((done.status.as_str(), done.completed), ("cancelled", 1));
        assert!(s.unfinished_batches().await.unwrap().is_empty());
        assert_eq!(s.list_batches("acme").await.unwrap().len(), 1);
        assert!(s.list_batches("globex").await.unwrap().is_empty());
    }
}
