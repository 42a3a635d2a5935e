//! What every handler shares: the served model and, once loaded, its engine.

use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use osprey_core::{Error, ErrorKind};
use osprey_engine::Engine;

/// Shared, cheaply cloned handler state.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    model_name: String,
    created: u64,
    engine: OnceLock<Engine>,
    load_error: OnceLock<String>,
}

impl AppState {
    /// State for a server that will serve `model_name` once its engine is set.
    pub fn new(model_name: impl Into<String>) -> Self {
        Self {
            inner: Arc::new(Inner {
                model_name: model_name.into(),
                created: unix_now(),
                engine: OnceLock::new(),
                load_error: OnceLock::new(),
            }),
        }
    }

    /// Marks the model loaded: requests are served from now on.
    pub fn set_engine(&self, engine: Engine) {
        let _ = self.inner.engine.set(engine);
    }

    /// Records that loading failed: requests get a 503 saying why.
    pub fn set_load_error(&self, error: String) {
        let _ = self.inner.load_error.set(error);
    }

    /// The served model's name.
    pub fn model_name(&self) -> &str {
        &self.inner.model_name
    }

    /// When the server started (Unix seconds).
    pub fn created(&self) -> u64 {
        self.inner.created
    }

    /// The engine, once loaded.
    pub fn engine(&self) -> Option<&Engine> {
        self.inner.engine.get()
    }

    /// The engine serving `model`: 404 for a model not served here, 503 while loading.
    pub fn engine_for(&self, model: &str) -> Result<Engine, Error> {
        if model != self.inner.model_name {
            return Err(Error::model_not_found(model));
        }
        if let Some(e) = self.inner.engine.get() {
            return Ok(e.clone());
        }
        let why = match self.inner.load_error.get() {
            Some(e) => format!("The model failed to load: {e}"),
            None => "The model is still loading; retry shortly.".to_owned(),
        };
        Err(Error::new(ErrorKind::Unavailable, why))
    }
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
