//! The edge's parts, shared by every request: the key checker ([`Authenticator`]), the
//! tenants' settings, the rate limiter and admission control ([`Edge`]), and who a request
//! is from once its key is checked ([`Caller`]). The gateway's middleware runs them in order
//! on every `/v1` request.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use axum::http::HeaderMap;
use osprey_core::metrics as names;
use osprey_core::{Error, ErrorKind, Priority, UsageReport};
use osprey_store::KeyRecord;

use crate::auth::Authenticator;
use crate::config::{EdgeConfig, OPEN_TENANT, Tenant};
use osprey_limits::RateLimiter;
use osprey_limits::admission::Admission;

/// Who is calling, for handlers (an extension on every request past the edge).
#[derive(Clone, Debug)]
pub struct Caller {
    /// The tenant's resolved settings.
    pub tenant: Arc<Tenant>,
    /// The key's id, when one was used.
    pub key_id: Option<String>,
    /// The end user the request is for, from the `x-osprey-user` header: conversations and
    /// memory belong to a tenant's user.
    pub user: Option<String>,
    /// The ACL groups it belongs to: the tenant's and its key's (never the request's own
    /// say).
    pub groups: Vec<String>,
    /// The tool scopes its key is granted, within its tenant's (`None`: the tenant's).
    pub tool_scopes: Option<Vec<String>>,
    /// What happens to the request on its way, for the request log.
    pub record: Arc<crate::record::RequestRecord>,
}

/// The header naming the end user a request is for.
pub const USER_HEADER: &str = "x-osprey-user";

impl Caller {
    /// The same caller, with a record of its own (for a request the gateway makes on its
    /// behalf, which must not mix its notes into the client request's).
    pub fn with_fresh_record(&self) -> Self {
        Self {
            record: Arc::default(),
            ..self.clone()
        }
    }

    /// Whose state a request reads and writes: the tenant's user named by the header, else
    /// by the body's `user` (chat requests), else the tenant's anonymous user (`""`).
    pub fn owner(&self, body_user: Option<&str>) -> osprey_store::Owner {
        osprey_store::Owner {
            tenant: self.tenant.name.clone(),
            user: (self.user.as_deref().or(body_user).unwrap_or_default()).to_owned(),
        }
    }

    /// The priority a request asks for in its `osprey` options, else the tenant's default.
    pub fn priority_of(&self, options: &Option<osprey_core::api::OspreyOptions>) -> Priority {
        options
            .as_ref()
            .and_then(|o| o.priority)
            .unwrap_or(self.tenant.priority)
    }
}

/// What the edge hands a generation handler (an extension on every admitted request).
#[derive(Clone, Debug)]
pub struct Admitted {
    /// Who is calling.
    pub caller: Caller,
    /// The model the body names, as the edge read it (`None` if the body is not JSON).
    pub model: Option<String>,
    /// Where the handler reports the request's actual token usage.
    pub usage: Arc<UsageReport>,
}

/// The edge's parts, shared by all requests.
pub struct Edge {
    config: EdgeConfig,
    auth: Arc<Authenticator>,
    limiter: RateLimiter,
    admission: Admission,
    tenants: RwLock<HashMap<String, Arc<Tenant>>>,
    running: Mutex<HashMap<String, u64>>,
}

impl Edge {
    /// An edge with `config`, checking keys with `auth` and limits with `limiter`.
    pub fn new(config: EdgeConfig, auth: Arc<Authenticator>, limiter: RateLimiter) -> Self {
        // The recorder first, or the limiter's gauge would be set before anything records it.
        crate::metrics::install();
        limiter.announce();
        Self {
            admission: Admission::new(config.admission),
            config,
            auth,
            limiter,
            tenants: RwLock::default(),
            running: Mutex::default(),
        }
    }

    /// An open edge: no keys, default limits in memory.
    pub fn open() -> Self {
        Self::new(
            EdgeConfig::default(),
            Authenticator::open(),
            RateLimiter::local(),
        )
    }

    /// The key checker.
    pub fn auth(&self) -> &Arc<Authenticator> {
        &self.auth
    }

    /// Requests in flight through admission control.
    pub fn in_flight(&self) -> u64 {
        self.admission.in_flight()
    }

    /// Admission control.
    pub fn admission(&self) -> &Admission {
        &self.admission
    }

    /// The rate limiter.
    pub fn limiter(&self) -> &RateLimiter {
        &self.limiter
    }

    /// The configuration.
    pub fn config(&self) -> &EdgeConfig {
        &self.config
    }

    /// The settings of tenant `name` (resolved once, then shared).
    pub fn tenant(&self, name: &str) -> Arc<Tenant> {
        if let Some(t) = self.tenants.read().expect("tenants lock").get(name) {
            return t.clone();
        }
        let t = Arc::new(self.config.tenant(name));
        self.tenants
            .write()
            .expect("tenants lock")
            .insert(name.to_owned(), t.clone());
        t
    }

    /// The admission of a request that never passed the edge: the open tenant, nothing read.
    pub fn unguarded(&self) -> Admitted {
        Admitted {
            caller: Caller {
                tenant: self.tenant(OPEN_TENANT),
                key_id: None,
                user: None,
                groups: Vec::new(),
                tool_scopes: None,
                record: Arc::default(),
            },
            model: None,
            usage: Arc::default(),
        }
    }

    /// Authenticates a request's headers: the caller, or a 401.
    pub async fn caller(
        &self,
        headers: &HeaderMap,
    ) -> Result<(Caller, Option<Arc<KeyRecord>>), Error> {
        let key = self.auth.authenticate(headers).await?;
        let tenant = self.tenant(key.as_ref().map_or(OPEN_TENANT, |k| k.tenant.as_str()));
        let user = (headers.get(USER_HEADER))
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(str::to_owned);
        let mut groups = tenant.groups.clone();
        groups.extend(key.iter().flat_map(|k| k.groups()));
        let caller = Caller {
            tenant,
            key_id: key.as_ref().map(|k| k.id.clone()),
            user,
            groups,
            tool_scopes: key.as_ref().and_then(|k| {
                (k.tool_scopes.as_deref()).map(|s| s.split(',').map(str::to_owned).collect())
            }),
            record: Arc::default(),
        };
        Ok((caller, key))
    }
}

/// A place in a tenant's concurrency limit, given back on drop.
pub struct TenantSlot {
    edge: Arc<Edge>,
    tenant: String,
}

impl TenantSlot {
    /// A place for a request of `tenant`, or a 429 when it has its limit in flight.
    pub fn take(edge: &Arc<Edge>, tenant: &Tenant) -> Result<Self, Error> {
        let mut running = edge.running.lock().expect("running lock");
        let n = running.entry(tenant.name.clone()).or_insert(0);
        if *n >= tenant.max_concurrent {
            metrics::counter!(names::RATE_LIMITED, "tenant" => tenant.name.clone(), "limit" => "concurrency").increment(1);
            return Err(Error::new(
                ErrorKind::RateLimited,
                format!(
                    "Tenant `{}` already has {} requests in flight, its limit.",
                    tenant.name, tenant.max_concurrent
                ),
            )
            .with_code("rate_limit_exceeded")
            .with_retry_after(1));
        }
        *n += 1;
        Ok(Self {
            edge: edge.clone(),
            tenant: tenant.name.clone(),
        })
    }
}

impl Drop for TenantSlot {
    fn drop(&mut self) {
        if let Some(n) = self
            .edge
            .running
            .lock()
            .expect("running lock")
            .get_mut(&self.tenant)
        {
            *n = n.saturating_sub(1);
        }
    }
}
