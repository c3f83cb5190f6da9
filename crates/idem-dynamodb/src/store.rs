//! [`DynamoStore`] and its builder: the URL, the SDK client (the URL's
//! endpoint, region and credentials, or the standard AWS chain's, on rustls
//! with ring), the settings, the clock, and the table opened (created when
//! missing, its key shape checked when not).

use std::sync::Arc;
use std::time::Duration;

use aws_config::environment::EnvironmentVariableRegionProvider;
use aws_config::meta::region::RegionProviderChain;
use aws_config::profile::ProfileFileRegionProvider;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::{Credentials, Region};
use idem_core::{Error, Settings, SharedClock, SystemClock, Timestamp};

use crate::location::{EMULATOR_REGION, TableUrl};
use crate::table;

/// How long connecting, and each attempt of a request, may take before the
/// request fails (and the SDK's own retry takes over).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

/// A store on one DynamoDB table: leased mode, and atomic mode for effects
/// that are DynamoDB writes. Cheap to clone; clones share the client.
///
/// ```no_run
/// # async fn demo() -> Result<(), idem_core::Error> {
/// use idem_core::{Claimed, Fingerprint, IdempotencyKey, LeaseStore, Outcome, Scope};
/// use idem_dynamodb::DynamoStore;
/// let store = DynamoStore::open("dynamodb:///idem").await?;
/// let (scope, key) = (Scope::new("emails").unwrap(), IdempotencyKey::new("welcome/7").unwrap());
/// if let Claimed::Fresh(claim) = store.claim(&scope, &key, Fingerprint::of_bytes(b"hi")).await? {
///     // send the e-mail, then record it
///     store.complete(&claim, &Outcome::success("sent")).await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct DynamoStore {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    table: String,
    settings: Settings,
    clock: SharedClock,
    shown: String,
    create: bool,
}

impl std::fmt::Debug for DynamoStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DynamoStore")
            .field("at", &self.inner.shown)
            .field("table", &self.inner.table)
            .finish_non_exhaustive()
    }
}

impl DynamoStore {
    /// A builder for the table at `url`: `dynamodb:///TABLE` (the AWS
    /// chain's endpoint, region and credentials), `dynamodb://HOST/TABLE`
    /// (that endpoint over HTTPS) or `dynamodb+http://KEY:SECRET@HOST:PORT/TABLE`
    /// (an emulator over plain HTTP, region `us-east-1` unless `?region=`
    /// names one).
    pub fn builder(url: impl Into<String>) -> DynamoStoreBuilder {
        DynamoStoreBuilder {
            url: url.into(),
            settings: Settings::default(),
            clock: Arc::new(SystemClock),
            create: true,
        }
    }

    /// Opens the table at `url` with the default settings, creating it when
    /// it is missing.
    pub async fn open(url: &str) -> Result<DynamoStore, Error> {
        Self::builder(url).open().await
    }

    /// Lease, retention and tombstones.
    pub fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    /// The clock leases and retention are measured with.
    pub fn clock(&self) -> &SharedClock {
        &self.inner.clock
    }

    /// The time by the store's clock.
    pub(crate) fn now(&self) -> Timestamp {
        self.inner.clock.now()
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.inner.table
    }

    /// The SDK client the store uses, for reads and writes of the caller's own.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// The store's URL without its secret, for messages.
    pub fn shown(&self) -> &str {
        &self.inner.shown
    }

    /// Whether the store creates its table when it is missing.
    pub(crate) fn creates_table(&self) -> bool {
        self.inner.create
    }
}

/// Options of a [`DynamoStore`]; [`open`](Self::open) opens it.
#[derive(Debug)]
pub struct DynamoStoreBuilder {
    url: String,
    settings: Settings,
    clock: SharedClock,
    create: bool,
}

impl DynamoStoreBuilder {
    /// Lease, retention and tombstones (the defaults: 60 s, 7 days, none).
    pub fn settings(mut self, settings: Settings) -> Self {
        self.settings = settings;
        self
    }

    /// The clock leases and retention are measured with (a manual one in tests).
    pub fn clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// Whether a missing table is created (the default) or refused, for
    /// credentials that may not create tables.
    pub fn create_table(mut self, create: bool) -> Self {
        self.create = create;
        self
    }

    /// Makes the client, then finds the table (creating it, on-demand and
    /// with its time to live on, when it is missing) and checks its key shape.
    pub async fn open(self) -> Result<DynamoStore, Error> {
        let shown = idem_core::redact_url(&self.url);
        let location = TableUrl::parse(&self.url)?;
        let client = client(&location, &shown).await?;
        table::open(&client, &location.table, &shown, self.create).await?;
        Ok(DynamoStore {
            inner: Arc::new(Inner {
                client,
                table: location.table,
                settings: self.settings,
                clock: self.clock,
                shown,
                create: self.create,
            }),
        })
    }
}

/// The SDK client for `location`: its endpoint, region and credentials, or
/// the standard chain's, over rustls with ring.
async fn client(location: &TableUrl, shown: &str) -> Result<Client, Error> {
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
            aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https();
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest()).http_client(http);
    match (&location.region, &location.endpoint) {
        (Some(region), _) => loader = loader.region(Region::new(region.clone())),
        // An endpoint of the URL's own that names no region (an emulator):
        // the environment's or the profile's region, else the emulators'
        // default. Never the instance metadata service, which the standard
        // chain asks last: off EC2 it only fails, with a warning and a wait.
        (None, Some(_)) => {
            loader = loader.region(
                RegionProviderChain::first_try(EnvironmentVariableRegionProvider::new())
                    .or_else(ProfileFileRegionProvider::builder().build())
                    .or_else(Region::new(EMULATOR_REGION)),
            );
        }
        (None, None) => {}
    }
    if let Some(endpoint) = &location.endpoint {
        loader = loader.endpoint_url(endpoint);
    }
    if let Some((key, secret)) = &location.credentials {
        loader = loader.credentials_provider(Credentials::new(
            key.clone(),
            secret.clone(),
            None,
            None,
            "the store's URL",
        ));
    }
    let shared = loader.load().await;
    let mut config = aws_sdk_dynamodb::config::Builder::from(&shared).timeout_config(
        aws_sdk_dynamodb::config::timeout::TimeoutConfig::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .operation_attempt_timeout(ATTEMPT_TIMEOUT)
            .build(),
    );
    if shared.region().is_none() {
        if location.endpoint.is_none() {
            return Err(idem_core::StoreError::new(
                idem_core::ErrorKind::Config,
                format!(
                    "{shown}: no AWS region: set AWS_REGION, a profile's region, or ?region= in the URL"
                ),
            )
            .into());
        }
        config = config.region(Region::new(EMULATOR_REGION));
    }
    Ok(Client::from_conf(config.build()))
}
