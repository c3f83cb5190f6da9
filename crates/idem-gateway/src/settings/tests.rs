//! The settings' resolution: each source, each default, each refusal.

use super::*;
use crate::{DEFAULT_BODY_TIMEOUT, TLS_SUBJECT_HEADER};

#[cfg(test)]
mod resolution {
    use super::*;

    fn upstream() -> GivenSettings {
        GivenSettings {
            upstream: Some("http://127.0.0.1:9000".into()),
            ..GivenSettings::default()
        }
    }

    fn from_file(given: &GivenSettings, text: &str) -> Result<GatewaySettings, SettingsError> {
        GatewaySettings::resolve(given, Some(SettingsFile::new("idem.toml", text)))
    }

    fn error(given: &GivenSettings) -> String {
        GatewaySettings::resolve(given, None)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn fingerprint_rules_read_from_flags_and_file_and_bad_ones_say_what_to_write() {
        let defaults = GatewaySettings::resolve(&upstream(), None).unwrap();
        assert!(defaults.fingerprint.is_whole_body());

        let mut given = upstream();
        given.fingerprint = Some("json:/currency,/amount".into());
        given.fingerprint_header = vec!["Content-Type,x-tenant".into()];
        let flagged = GatewaySettings::resolve(&given, None).unwrap();
        assert_eq!(
            flagged.fingerprint.to_string(),
            "json:/amount,/currency header:content-type header:x-tenant"
        );
        assert_eq!(
            flagged.idempotency().fingerprint_rule(),
            &flagged.fingerprint
        );
        assert!(
            flagged
                .to_string()
                .contains("fingerprint json:/amount,/currency header:content-type")
        );
        let again = from_file(&GivenSettings::default(), &flagged.to_toml()).unwrap();
        assert_eq!(again, flagged);

        let text = "upstream = \"http://127.0.0.1:9000\"\nfingerprint_ignore = \"json:/sent_at\"\nfingerprint_header = [\"x-tenant\"]\n";
        let filed = from_file(&GivenSettings::default(), text).unwrap();
        assert_eq!(
            filed.fingerprint.to_string(),
            "ignore json:/sent_at header:x-tenant"
        );
        let again = from_file(&GivenSettings::default(), &filed.to_toml()).unwrap();
        assert_eq!(again, filed);

        let bad = |select: Option<&str>, ignore: Option<&str>, header: Option<&str>| {
            let mut given = upstream();
            given.fingerprint = select.map(Into::into);
            given.fingerprint_ignore = ignore.map(Into::into);
            given.fingerprint_header = header.map(Into::into).into_iter().collect();
            error(&given)
        };
        let e = bad(Some("/amount"), None, None);
        assert!(
            e.contains("--fingerprint (or IDEM_FINGERPRINT)")
                && e.contains("does not start with json:"),
            "{e}"
        );
        let e = bad(Some("json:"), None, None);
        assert!(e.contains("names no field"), "{e}");
        let e = bad(None, Some("json:sent_at"), None);
        assert!(
            e.contains("--fingerprint-ignore (or IDEM_FINGERPRINT_IGNORE)")
                && e.contains("not a JSON Pointer"),
            "{e}"
        );
        let e = bad(Some("json:/a"), Some("json:/b"), None);
        assert!(e.contains("give one of the two"), "{e}");
        let e = bad(None, None, Some("x tenant"));
        assert!(
            e.contains("--fingerprint-header (or IDEM_FINGERPRINT_HEADER)")
                && e.contains("is not a header name"),
            "{e}"
        );
        let e = bad(None, None, Some(" , "));
        assert!(e.contains("no header named"), "{e}");
        let e = from_file(
            &GivenSettings::default(),
            "upstream = \"http://127.0.0.1:9000\"\nfingerprint = \"amount\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("`fingerprint` in idem.toml"), "{e}");
    }

    #[test]
    fn the_grpc_code_policy_needs_grpc_calls_and_rules() {
        let mut given = upstream();
        given.on_grpc_status = Some("internal=store".into());
        let alone = GatewaySettings::resolve(&given, None)
            .unwrap_err()
            .to_string();
        assert!(alone.contains("--grpc-unary"), "{alone}");
        given.grpc_unary = Some("/p.Pay/Charge".into());
        let set = GatewaySettings::resolve(&given, None).unwrap();
        assert_eq!(set.on_grpc_status.as_deref(), Some("internal=store"));
        let again = GatewaySettings::resolve(
            &GivenSettings::default(),
            Some(SettingsFile::new("again.toml", &set.to_toml())),
        )
        .unwrap();
        assert_eq!(again.on_grpc_status, set.on_grpc_status);
        given.on_grpc_status = Some("internal".into());
        let bad = GatewaySettings::resolve(&given, None)
            .unwrap_err()
            .to_string();
        assert!(
            bad.contains("--on-grpc-status (or IDEM_ON_GRPC_STATUS)")
                && bad.contains("CODE=VERDICT"),
            "{bad}"
        );
    }

    #[test]
    fn the_grpc_probe_is_read_checked_and_written_out() {
        let text = "upstream = \"h2c://127.0.0.1:50051\"\ngrpc_unary = [\"/p.Pay/Charge\"]\ngrpc_probe = \"/p.Pay/Lookup, /p.Pay/Refund = /p.Pay/LookupRefund\"\n";
        let filed = from_file(&GivenSettings::default(), text).unwrap();
        assert_eq!(
            filed.grpc_probe.as_deref(),
            Some("/p.Pay/Lookup,/p.Pay/Refund=/p.Pay/LookupRefund")
        );
        let again = from_file(&GivenSettings::default(), &filed.to_toml()).unwrap();
        assert_eq!(again, filed);
        assert!(filed.gateway().unwrap().grpc_probed);
        assert!(!again.gateway().is_ok_and(|g| g.probe.is_some()));

        let mut given = upstream();
        given.grpc_unary = Some("/p.Pay/Charge".into());
        given.grpc_probe = Some("off".into());
        assert_eq!(
            GatewaySettings::resolve(&given, None).unwrap().grpc_probe,
            None
        );
        for (bad, says) in [
            ("Lookup", "not a gRPC method path"),
            ("/p.Pay/A=/p.Pay/B=/p.Pay/C", "METHOD=LOOKUP"),
            ("/p.Pay/L1,/p.Pay/L2", "one lookup method for every method"),
        ] {
            given.grpc_probe = Some(bad.into());
            let e = GatewaySettings::resolve(&given, None)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("--grpc-probe (or IDEM_GRPC_PROBE)") && e.contains(says),
                "{bad}: {e}"
            );
        }
        let mut alone = upstream();
        alone.grpc_probe = Some("/p.Pay/Lookup".into());
        let e = GatewaySettings::resolve(&alone, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--grpc-unary"), "{e}");
    }

    #[test]
    fn grpc_methods_read_from_flags_and_file_and_bad_ones_say_what_to_write() {
        let text = "upstream = \"h2c://127.0.0.1:50051\"\ngrpc_unary = [\"/payments.v1.Payments/Charge\"]\n";
        let filed = from_file(&GivenSettings::default(), text).unwrap();
        assert_eq!(filed.grpc_unary, ["/payments.v1.Payments/Charge"]);
        assert!(filed.upstream.is_http2());
        let again = from_file(&GivenSettings::default(), &filed.to_toml()).unwrap();
        assert_eq!(again, filed);

        let mut given = upstream();
        given.grpc_unary = Some("/a.B/C, /a.B/C,/a.B/D".into());
        let flagged = GatewaySettings::resolve(&given, None).unwrap();
        assert_eq!(flagged.grpc_unary, ["/a.B/C", "/a.B/D"]);
        for bad in ["a.B/C", "/a.B", "/a.B/C/D", "/a B/C"] {
            given.grpc_unary = Some(bad.into());
            let error = error(&given);
            assert!(
                error.contains("--grpc-unary (or IDEM_GRPC_UNARY)")
                    && error.contains("/package.Service/Method"),
                "{bad}: {error}"
            );
        }
    }

    #[test]
    fn defaults_need_only_an_upstream() {
        let missing = error(&GivenSettings::default());
        assert!(missing.contains("--upstream"), "{missing}");
        let settings = GatewaySettings::resolve(&upstream(), None).unwrap();
        assert_eq!(settings.listen, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(settings.store, StoreLocation::Sqlite("idem.db".into()));
        assert_eq!(settings.mode, Mode::Ietf);
        assert!(!settings.require_key);
        assert_eq!(settings.max_body, 1 << 20);
        assert_eq!(settings.lease, Duration::from_secs(60));
        assert_eq!(settings.retention, Duration::from_secs(7 * 86400));
        assert_eq!(settings.upstream_timeout, Duration::from_secs(30));
        assert_eq!(settings.admin_listen, None);
        assert_eq!(settings.principal_header, Some(http::header::AUTHORIZATION));
        assert_eq!(settings.methods, [Method::POST, Method::PATCH]);
        assert_eq!(settings.sweep_every, Some(Duration::from_secs(60)));
        assert_eq!(settings.body_timeout, Duration::from_secs(30));
        assert_eq!(settings.max_in_flight, Some(DEFAULT_MAX_IN_FLIGHT));
        assert_eq!(
            settings.gateway().unwrap().max_in_flight,
            Some(DEFAULT_MAX_IN_FLIGHT)
        );
        assert!(settings.routes.is_empty());
    }

    #[test]
    fn the_runtime_and_its_workers_read_from_flags_and_file() {
        let defaults = GatewaySettings::resolve(&upstream(), None).unwrap();
        assert_eq!(defaults.runtime, crate::Runtime::PerCore);
        assert_eq!(
            defaults.gateway().unwrap().serving_runtime(),
            crate::Runtime::PerCore
        );
        assert_eq!(defaults.workers, None);

        let text = "upstream = \"http://127.0.0.1:9000\"\nruntime = \"per-core\"\nworkers = 3\n";
        let mut given = GivenSettings::default();
        let filed = from_file(&given, text).unwrap();
        assert_eq!(filed.runtime, crate::Runtime::PerCore);
        assert_eq!(filed.workers, std::num::NonZeroUsize::new(3));
        let config = filed.gateway().unwrap();
        assert_eq!(config.serving_runtime(), crate::Runtime::PerCore);
        assert_eq!(config.worker_count().get(), 3);
        assert_eq!(from_file(&given, &filed.to_toml()).unwrap(), filed);
        assert!(filed.to_string().contains("runtime per-core (3)"));

        given.runtime = Some("Shared".into());
        let error = from_file(&given, text).unwrap_err().to_string();
        assert!(
            error.contains("runtime is shared") && error.contains("workers"),
            "{error}"
        );
        let flagged = from_file(&given, "upstream = \"http://127.0.0.1:9000\"\n").unwrap();
        assert_eq!(flagged.runtime, crate::Runtime::Shared);
        assert_eq!(
            flagged.gateway().unwrap().serving_runtime(),
            crate::Runtime::Shared
        );
        assert_eq!(
            from_file(&GivenSettings::default(), &flagged.to_toml()).unwrap(),
            flagged
        );

        given.runtime = Some("threads".into());
        let error = from_file(&given, text).unwrap_err().to_string();
        assert!(
            error.contains("--runtime (or IDEM_RUNTIME)") && error.contains("per-core or shared"),
            "{error}"
        );
        given.runtime = None;
        for bad in ["0", "lots", "5000"] {
            given.workers = Some(bad.into());
            let error = from_file(&given, text).unwrap_err().to_string();
            assert!(
                error.contains("--workers (or IDEM_WORKERS)") && error.contains("from 1 to"),
                "{bad}: {error}"
            );
        }
    }

    #[test]
    fn the_limit_in_flight_and_the_routes_read_from_flags_and_file() {
        let text = "upstream = \"http://127.0.0.1:9000\"\nmax_in_flight = 256\nroutes = [\"/payments/{id}\", \"/orders\"]\n";
        let mut given = GivenSettings::default();
        let filed = from_file(&given, text).unwrap();
        assert_eq!(filed.max_in_flight, Some(256));
        assert_eq!(filed.routes, ["/payments/{id}", "/orders"]);
        assert_eq!(filed.gateway().unwrap().max_in_flight, Some(256));

        given.max_in_flight = Some("off".into());
        given.routes = Some("/files/{*path}, /orders,/orders".into());
        let flagged = from_file(&given, text).unwrap();
        assert_eq!(flagged.max_in_flight, None);
        assert_eq!(flagged.routes, ["/files/{*path}", "/orders"]);
        assert_eq!(from_file(&given, &flagged.to_toml()).unwrap(), flagged);

        for (bad, says) in [
            ("0", "from 1 to"),
            ("many", "off for no limit"),
            ("2000000", "from 1 to"),
        ] {
            given.max_in_flight = Some(bad.into());
            let error = from_file(&given, text).unwrap_err().to_string();
            assert!(
                error.contains("--max-in-flight (or IDEM_MAX_IN_FLIGHT)") && error.contains(says),
                "{bad}: {error}"
            );
        }
        given.max_in_flight = None;
        for (bad, says) in [
            ("payments", "start with /"),
            ("/a b", "no spaces"),
            ("/pay{id}", "whole segment"),
            ("/files/{*rest}/x", "last segment"),
            ("/{}", "whole segment"),
        ] {
            given.routes = Some(bad.into());
            let error = from_file(&given, text).unwrap_err().to_string();
            assert!(
                error.contains("--routes (or IDEM_ROUTES)") && error.contains(says),
                "{bad}: {error}"
            );
        }
    }

    #[test]
    fn concurrent_duplicates_wait_only_when_asked_and_bad_values_say_what_to_write() {
        let text = "upstream = \"http://127.0.0.1:9000\"\n";
        let mut given = GivenSettings::default();
        let defaults = from_file(&given, text).unwrap();
        assert_eq!(defaults.concurrent, Concurrent::Reject);
        assert_eq!(defaults.waiter_caps, WaiterCaps::default());
        assert_eq!(
            defaults.idempotency().concurrent_duplicates(),
            Concurrent::Reject
        );

        let filed = from_file(
            &given,
            "upstream = \"http://127.0.0.1:9000\"\nconcurrent = \"wait:5s\"\nmax_waiters = 500\nmax_waiters_per_key = \"8\"\n",
        )
        .unwrap();
        assert_eq!(filed.concurrent, Concurrent::Wait(Duration::from_secs(5)));
        assert_eq!(
            filed.waiter_caps,
            WaiterCaps {
                per_key: 8,
                total: 500
            }
        );
        let config = filed.idempotency();
        assert_eq!(config.waiters().per_key, 8);
        assert_eq!(
            config.concurrent_duplicates(),
            Concurrent::Wait(Duration::from_secs(5))
        );
        assert_eq!(from_file(&given, &filed.to_toml()).unwrap(), filed);
        assert!(filed.to_string().contains("wait up to 5s"), "{filed}");

        given.concurrent = Some("WAIT:250ms".into());
        let flagged = from_file(&given, text).unwrap();
        assert_eq!(
            flagged.concurrent,
            Concurrent::Wait(Duration::from_millis(250))
        );
        assert_eq!(from_file(&given, &flagged.to_toml()).unwrap(), flagged);
        given.concurrent = Some("reject".into());
        assert_eq!(
            from_file(&given, text).unwrap().concurrent,
            Concurrent::Reject
        );

        for (bad, says) in [
            ("wait", "reject (409 at once) or wait:DURATION"),
            ("sleep:5s", "\"sleep\" is not wait"),
            ("wait:0s", "is zero"),
            ("wait:soon", "not a duration"),
            ("wait:1h", "longer than 10m"),
        ] {
            given.concurrent = Some(bad.into());
            let error = from_file(&given, text).unwrap_err().to_string();
            assert!(
                error.contains("--concurrent (or IDEM_CONCURRENT)") && error.contains(says),
                "{bad}: {error}"
            );
        }
        given.concurrent = None;
        given.max_waiters_per_key = Some("0".into());
        let error = from_file(&given, text).unwrap_err().to_string();
        assert!(
            error.contains("--max-waiters-per-key (or IDEM_MAX_WAITERS_PER_KEY)")
                && error.contains("from 1 to"),
            "{error}"
        );
    }

    #[test]
    fn put_and_delete_require_a_key_when_listed() {
        let text =
            "upstream = \"http://127.0.0.1:9000\"\nmethods = [\"post\", \"PUT\", \"DELETE\"]\n";
        let mut given = GivenSettings::default();
        let settings = from_file(&given, text).unwrap();
        assert_eq!(
            settings.methods,
            [Method::POST, Method::PUT, Method::DELETE]
        );
        let config = settings.idempotency();
        assert!(config.accepts_key(&Method::PUT) && config.accepts_key(&Method::DELETE));
        // Not listed: keyless PATCH passes, keyed PATCH is still deduplicated.
        assert!(config.accepts_key(&Method::PATCH));
        assert_eq!(
            config.key_methods(),
            [Method::POST, Method::PUT, Method::DELETE]
        );

        given.methods = Some("POST, PATCH,PUT".into());
        let flagged = from_file(&given, text).unwrap();
        assert_eq!(flagged.methods, [Method::POST, Method::PATCH, Method::PUT]);

        for (bad, says) in [
            ("GET,POST", "changes nothing"),
            ("", "no method given"),
            ("PO ST", "not an HTTP method"),
        ] {
            given.methods = Some(bad.into());
            let error = from_file(&given, text).unwrap_err().to_string();
            assert!(
                error.contains("--methods (or IDEM_METHODS)") && error.contains(says),
                "{bad}: {error}"
            );
        }
    }

    #[test]
    fn flags_beat_the_file_and_the_file_beats_defaults() {
        let text = r#"
            upstream = "http://127.0.0.1:9000/api"
            listen = "0.0.0.0:8081"
            store = "sqlite:///var/lib/idem/idem.db"
            mode = "stripe"
            require_key = true
            max_body = 4096
            lease = "30s"
            retention = "24h"
            admin_listen = "127.0.0.1:9090"
            upstream_timeout = "5s"
            principal_header = "x-tenant-id"
            sweep_every = "off"
            "#;
        let mut given = GivenSettings::default();
        let filed = from_file(&given, text).unwrap();
        assert_eq!(filed.upstream.to_string(), "http://127.0.0.1:9000/api");
        assert_eq!(filed.listen, "0.0.0.0:8081".parse().unwrap());
        assert_eq!(
            filed.store,
            StoreLocation::Sqlite("/var/lib/idem/idem.db".into())
        );
        assert_eq!(filed.mode, Mode::Stripe);
        assert!(filed.require_key);
        assert_eq!(filed.max_body, 4096);
        assert_eq!(filed.lease, Duration::from_secs(30));
        assert_eq!(filed.retention, Duration::from_secs(86400));
        assert_eq!(filed.admin_listen, Some("127.0.0.1:9090".parse().unwrap()));
        assert_eq!(filed.upstream_timeout, Duration::from_secs(5));
        assert_eq!(filed.principal_header.unwrap().as_str(), "x-tenant-id");
        assert_eq!(filed.sweep_every, None);

        given.upstream = Some("http://10.1.2.3:80".into());
        given.store = Some("sqlite://other.db".into());
        given.mode = Some("ietf".into());
        given.require_key = Some(false);
        given.max_body = Some("2KiB".into());
        given.lease = Some("10s".into());
        given.principal_header = Some("none".into());
        let flagged = from_file(&given, text).unwrap();
        assert_eq!(flagged.upstream.to_string(), "http://10.1.2.3:80");
        assert_eq!(flagged.store, StoreLocation::Sqlite("other.db".into()));
        assert_eq!(flagged.mode, Mode::Ietf);
        assert!(!flagged.require_key);
        assert_eq!(flagged.max_body, 2048);
        assert_eq!(flagged.lease, Duration::from_secs(10));
        assert_eq!(flagged.principal_header, None);
        // Not given as flags: still from the file.
        assert_eq!(flagged.retention, Duration::from_secs(86400));
        assert_eq!(flagged.listen, "0.0.0.0:8081".parse().unwrap());
    }

    #[test]
    fn tombstones_are_off_unless_given_a_duration() {
        let mut given = upstream();
        let resolved = |given: &GivenSettings| GatewaySettings::resolve(given, None).unwrap();
        assert_eq!(resolved(&given).tombstones, None);
        assert_eq!(
            resolved(&given).idempotency().store_settings().tombstones,
            None
        );
        given.tombstones = Some("30d".into());
        let on = resolved(&given);
        assert_eq!(on.tombstones, Some(Duration::from_secs(30 * 86400)));
        assert_eq!(
            on.idempotency().store_settings().tombstones,
            Some(Duration::from_secs(30 * 86400))
        );
        given.tombstones = Some("off".into());
        assert_eq!(resolved(&given).tombstones, None);
        given.tombstones = Some("a month".into());
        let refused = error(&given);
        assert!(refused.contains("--tombstones"), "{refused}");
        let filed = from_file(
            &GivenSettings::default(),
            "upstream = \"http://127.0.0.1:9000\"\ntombstones = \"12h\"\n",
        )
        .unwrap();
        assert_eq!(filed.tombstones, Some(Duration::from_secs(12 * 3600)));
    }

    #[test]
    fn bad_input_names_its_source_and_what_to_write() {
        let given = GivenSettings::default();
        let misspelt = from_file(
            &given,
            "upstream = \"http://127.0.0.1:9000\"\nlease_time = \"5s\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            misspelt.contains("lease_time") && misspelt.contains("idem.toml"),
            "{misspelt}"
        );
        let size = from_file(
            &given,
            "upstream = \"http://127.0.0.1:9000\"\nmax_body = \"lots\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            size.contains("`max_body` in idem.toml") && size.contains("1MiB"),
            "{size}"
        );

        let mut given = upstream();
        given.lease = Some("forever".into());
        let lease = error(&given);
        assert!(
            lease.contains("--lease (or IDEM_LEASE)") && lease.contains("60s"),
            "{lease}"
        );
        given.lease = None;
        given.retention = Some("30s".into());
        assert!(error(&given).contains("longer than the lease"));
        given.retention = None;
        given.listen = Some("localhost".into());
        assert!(error(&given).contains("IP:PORT"));
        given.listen = None;
        given.mode = Some("paypal".into());
        assert!(error(&given).contains("ietf or stripe"));
        given.mode = None;
        given.store = Some("mysql://x".into());
        let store = error(&given);
        assert!(
            store.contains("--store") && store.contains("sqlite://"),
            "{store}"
        );
        given.store = None;
        given.upstream = Some("ftp://example.com".into());
        let scheme = error(&given);
        assert!(
            scheme.contains("--upstream") && scheme.contains("HTTP or HTTPS"),
            "{scheme}"
        );
    }

    #[test]
    fn tls_files_come_in_pairs_and_fit_the_upstream_and_the_principal() {
        let secure = || GivenSettings {
            upstream: Some("https://api.example.com".into()),
            ..GivenSettings::default()
        };
        let settings = GatewaySettings::resolve(&secure(), None).unwrap();
        assert!(settings.upstream.is_https());
        assert!(settings.upstream_tls.is_default());
        assert_eq!(settings.tls, None);

        let mut given = secure();
        given.tls_cert = Some("cert.pem".into());
        assert!(error(&given).contains("--tls-cert was given without --tls-key"));
        given.tls_cert = None;
        given.tls_key = Some("key.pem".into());
        assert!(error(&given).contains("--tls-key was given without --tls-cert"));
        given.tls_key = None;
        given.tls_client_ca = Some("clients.pem".into());
        assert!(error(&given).contains("needs a TLS listener"));
        given.tls_client_ca = None;
        given.upstream_cert = Some("client.pem".into());
        assert!(error(&given).contains("without --upstream-key"));
        given.upstream_cert = None;
        given.principal_header = Some("tls-subject".into());
        assert!(error(&given).contains("--tls-client-ca"));

        let mut plain = upstream();
        plain.upstream_ca = Some("ca.pem".into());
        assert!(error(&plain).contains("https:// upstream"));

        let text = r#"
            upstream = "https://api.example.com"
            upstream_ca = "/etc/idem/upstream-ca.pem"
            tls_cert = "/etc/idem/cert.pem"
            tls_key = "/etc/idem/key.pem"
            tls_client_ca = "/etc/idem/clients.pem"
            principal_header = "tls-subject"
            admin_token_file = "/etc/idem/admin-token"
        "#;
        let filed = from_file(&GivenSettings::default(), text).unwrap();
        assert!(filed.principal_tls_subject);
        assert_eq!(
            filed.principal_header.as_ref().map(HeaderName::as_str),
            Some(TLS_SUBJECT_HEADER)
        );
        let tls = filed.tls.clone().unwrap();
        assert_eq!(tls.cert, PathBuf::from("/etc/idem/cert.pem"));
        assert_eq!(tls.client_ca, Some(PathBuf::from("/etc/idem/clients.pem")));
        assert_eq!(
            filed.admin_token_file,
            Some(PathBuf::from("/etc/idem/admin-token"))
        );
        let again = from_file(&GivenSettings::default(), &filed.to_toml()).unwrap();
        assert_eq!(again.tls, filed.tls);
        assert_eq!(again.upstream_tls, filed.upstream_tls);
        assert_eq!(again.admin_token_file, filed.admin_token_file);
        assert!(again.principal_tls_subject);
        // The CA file is read only when the gateway is set up: a missing one
        // is named then.
        let missing = filed.gateway().unwrap_err().to_string();
        assert!(missing.contains("upstream-ca.pem"), "{missing}");
    }

    #[test]
    fn settings_written_out_resolve_to_themselves() {
        let text = r#"
            upstream = "http://127.0.0.1:9000/api"
            store = "postgres://idem:secret@127.0.0.1:5432/idem"
            mode = "stripe"
            max_body = "64KiB"
            lease = "1m 30s"
            admin_listen = "127.0.0.1:9090"
            principal_header = "none"
            methods = "put,post"
            "#;
        let settings = from_file(&GivenSettings::default(), text).unwrap();
        let written = settings.to_toml();
        assert!(written.contains("secret"), "{written}");
        assert_eq!(
            from_file(&GivenSettings::default(), &written).unwrap(),
            settings
        );
        let defaults = GatewaySettings::resolve(&upstream(), None).unwrap();
        assert_eq!(
            from_file(&GivenSettings::default(), &defaults.to_toml()).unwrap(),
            defaults
        );
    }

    #[test]
    fn the_fuzz_seeds_that_resolve_write_out_to_themselves() {
        let seeds = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../fuzz/corpus/gateway_settings");
        let mut resolved = 0;
        for entry in std::fs::read_dir(seeds).expect("the seed corpus") {
            let text = std::fs::read_to_string(entry.expect("a seed").path()).expect("a seed");
            let Ok(settings) = from_file(&GivenSettings::default(), &text) else {
                continue;
            };
            resolved += 1;
            assert_eq!(
                from_file(&GivenSettings::default(), &settings.to_toml()).unwrap(),
                settings
            );
        }
        assert!(resolved >= 3, "{resolved} seeds resolved");
    }

    #[test]
    fn the_status_policy_is_read_from_each_source_checked_and_shown() {
        let defaults = GatewaySettings::resolve(&upstream(), None).unwrap();
        assert_eq!(defaults.on_status, StatusPolicy::standard());
        assert!(
            defaults.to_string().contains(
                "answers standard (500=release,502=unknown,503=release,504=unknown,429=release)"
            ),
            "{defaults}"
        );
        let file = SettingsFile::new(
            "idem.toml",
            "upstream = \"http://127.0.0.1:9000\"\non_status = \"500=store\"\nprobe = \"GET /p/{key}\"\n",
        );
        let filed = GatewaySettings::resolve(&GivenSettings::default(), Some(file)).unwrap();
        assert!(
            filed
                .to_string()
                .contains("answers standard,500=store (500=store,502=unknown"),
            "{filed}"
        );
        let again = GatewaySettings::resolve(
            &GivenSettings::default(),
            Some(SettingsFile::new("again.toml", &filed.to_toml())),
        )
        .unwrap();
        assert_eq!(again.on_status, filed.on_status);
        let mut given = upstream();
        given.on_status = Some("5xx=unknown".into());
        let flagged = GatewaySettings::resolve(&given, None).unwrap();
        assert_eq!(
            flagged
                .idempotency()
                .status_policy()
                .verdict(http::StatusCode::SERVICE_UNAVAILABLE, false),
            idem_http::Verdict::Unknown
        );
        given.on_status = Some("502=maybe".into());
        let refused = GatewaySettings::resolve(&given, None)
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains("--on-status (or IDEM_ON_STATUS)")
                && refused.contains("store, release or unknown"),
            "{refused}"
        );
    }

    #[test]
    fn the_probe_and_the_spool_are_read_checked_and_written_out() {
        let defaults = GatewaySettings::resolve(&upstream(), None).unwrap();
        assert_eq!(defaults.probe, None);
        assert_eq!(defaults.spool, Some(PathBuf::from("idem.db.spool")));
        assert_eq!(defaults.gateway().unwrap().probe_template(), None);

        let text = "upstream = \"http://127.0.0.1:9000\"\nstore = \"postgres://127.0.0.1/idem\"\nprobe = \"GET /payments/by-key/{key}\"\n";
        let filed = from_file(&GivenSettings::default(), text).unwrap();
        assert_eq!(filed.spool, Some(PathBuf::from(DEFAULT_SPOOL)));
        assert_eq!(
            filed.probe.as_ref().map(ToString::to_string).as_deref(),
            Some("GET /payments/by-key/{key}")
        );
        assert!(filed.gateway().unwrap().probe_template().is_some());
        assert_eq!(
            from_file(&GivenSettings::default(), &filed.to_toml()).unwrap(),
            filed
        );

        let mut given = upstream();
        given.spool = Some("off".into());
        given.probe = Some("off".into());
        let off = GatewaySettings::resolve(&given, None).unwrap();
        assert_eq!((off.spool.clone(), off.probe.clone()), (None, None));
        assert_eq!(
            from_file(&GivenSettings::default(), &off.to_toml()).unwrap(),
            off
        );

        given.spool = Some(" ".into());
        let empty = error(&given);
        assert!(
            empty.contains("--spool (or IDEM_SPOOL)") && empty.contains("off"),
            "{empty}"
        );
        given.spool = None;
        given.probe = Some("GET /payments".into());
        let probe = error(&given);
        assert!(
            probe.contains("--probe (or IDEM_PROBE)")
                && probe.contains("no {key}")
                && probe.contains("GET /payments/by-key/{key}"),
            "{probe}"
        );
    }

    #[test]
    fn a_lease_under_a_second_and_a_negative_duration_are_refused_with_why() {
        let mut given = upstream();
        for short in ["1ms", "999ms", "500ms"] {
            given.lease = Some(short.into());
            let refused = error(&given);
            assert!(
                refused.contains("--lease (or IDEM_LEASE)")
                    && refused.contains("shortest lease")
                    && refused.contains("renewed every third of its lease"),
                "{short}: {refused}"
            );
        }
        given.lease = Some("1s".into());
        assert_eq!(
            GatewaySettings::resolve(&given, None).unwrap().lease,
            Duration::from_secs(1)
        );
        let filed = from_file(
            &GivenSettings::default(),
            "upstream = \"http://127.0.0.1:9000\"\nlease = \"10ms\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            filed.contains("`lease` in idem.toml") && filed.contains("shortest lease"),
            "{filed}"
        );

        given.lease = Some("-5s".into());
        let negative = error(&given);
        assert!(
            negative.contains("--lease (or IDEM_LEASE)")
                && negative.contains("a negative duration"),
            "{negative}"
        );
        given.lease = None;
        given.upstream_timeout = Some(" -1m".into());
        assert!(error(&given).contains("a negative duration"));
    }

    #[test]
    fn the_body_timeout_reads_from_flags_and_file_and_is_written_out() {
        let defaults = GatewaySettings::resolve(&upstream(), None).unwrap();
        assert_eq!(defaults.body_timeout, DEFAULT_BODY_TIMEOUT);
        assert!(
            defaults.to_string().contains("body timeout 30s"),
            "{defaults}"
        );
        let text = "upstream = \"http://127.0.0.1:9000\"\nbody_timeout = \"5s\"\n";
        let filed = from_file(&GivenSettings::default(), text).unwrap();
        assert_eq!(filed.body_timeout, Duration::from_secs(5));
        assert_eq!(
            filed.gateway().unwrap().body_timeout,
            Duration::from_secs(5)
        );
        assert_eq!(
            from_file(&GivenSettings::default(), &filed.to_toml()).unwrap(),
            filed
        );
        let mut given = upstream();
        given.body_timeout = Some("2s".into());
        assert_eq!(
            from_file(&given, text).unwrap().body_timeout,
            Duration::from_secs(2)
        );
        given.body_timeout = Some("slowly".into());
        assert!(error(&given).contains("--body-timeout (or IDEM_BODY_TIMEOUT)"));
    }

    #[test]
    fn the_upstream_password_is_used_and_never_shown() {
        let mut given = upstream();
        given.upstream = Some("http://gw:pa%40ss@127.0.0.1:9000/api".into());
        let settings = GatewaySettings::resolve(&given, None).unwrap();
        assert_eq!(
            settings.upstream.to_string(),
            "http://gw:***@127.0.0.1:9000/api"
        );
        for shown in [
            settings.to_string(),
            format!("{settings:?}"),
            format!("{:?}", settings.gateway().unwrap()),
        ] {
            assert!(
                !shown.contains("pa%40ss") && !shown.contains("pa@ss"),
                "{shown}"
            );
        }
        // "gw:pa@ss" in base64.
        assert_eq!(
            settings.upstream.basic_auth().unwrap(),
            "Basic Z3c6cGFAc3M="
        );
        // A config file written out keeps it, like the store's password.
        assert!(settings.to_toml().contains("gw:pa%40ss@"));
        assert_eq!(
            from_file(&GivenSettings::default(), &settings.to_toml()).unwrap(),
            settings
        );
        given.upstream = Some("ftp://gw:s3cret@127.0.0.1:9000".into());
        let refused = error(&given);
        assert!(
            refused.contains("gw:***@") && !refused.contains("s3cret"),
            "{refused}"
        );
    }

    #[test]
    fn sizes_and_durations_read_as_people_write_them() {
        assert_eq!(parse_size("65536").unwrap(), 65536);
        assert_eq!(parse_size("64KiB").unwrap(), 65536);
        assert_eq!(parse_size("1MiB").unwrap(), 1 << 20);
        assert_eq!(parse_size("1 mb").unwrap(), 1_000_000);
        for bad in ["", "MiB", "1.5MiB", "12 parsecs", "0", "-1"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_duration("60s").unwrap(), Duration::from_secs(60));
        assert_eq!(
            parse_duration("7d").unwrap(),
            Duration::from_secs(7 * 86400)
        );
        assert_eq!(parse_duration("300ms").unwrap(), Duration::from_millis(300));
        let error = parse_duration("sixty").unwrap_err().to_string();
        assert!(error.contains("such as 300ms"), "{error}");
        assert!(parse_duration("0s").is_err());
    }
}

#[cfg(test)]
mod allow_hosts {
    use super::{GatewaySettings, GivenSettings, SettingsFile};

    fn resolve(given: &GivenSettings, text: &str) -> Result<GatewaySettings, String> {
        let file = SettingsFile::new("idem.toml", text);
        GatewaySettings::resolve(given, Some(file)).map_err(|e| e.to_string())
    }

    #[test]
    fn allowed_hosts_come_from_the_flag_else_the_file() {
        let upstream = "upstream = \"http://127.0.0.1:9000\"\n";
        let none = resolve(&GivenSettings::default(), upstream).unwrap();
        assert!(!none.allow_hosts.is_extended());
        assert!(!none.to_toml().contains("allow_hosts"));

        let text = format!("{upstream}allow_hosts = [\"console.internal\", \"*.ops.example\"]\n");
        let filed = resolve(&GivenSettings::default(), &text).unwrap();
        assert!(filed.allow_hosts.admits("console.internal:9090"));
        assert!(filed.allow_hosts.admits("a.ops.example"));
        assert!(!filed.allow_hosts.admits("evil.example"));
        let again = resolve(&GivenSettings::default(), &filed.to_toml()).unwrap();
        assert_eq!(again.allow_hosts, filed.allow_hosts);

        let flagged = GivenSettings {
            allow_hosts: vec!["admin.example,10.0.0.5".into()],
            ..GivenSettings::default()
        };
        let flagged = resolve(&flagged, &text).unwrap();
        assert!(flagged.allow_hosts.admits("admin.example"));
        assert!(
            !flagged.allow_hosts.admits("console.internal"),
            "the flag wins"
        );

        let error = resolve(
            &GivenSettings::default(),
            &format!("{upstream}allow_hosts = \"*\"\n"),
        )
        .unwrap_err();
        assert!(error.contains("`allow_hosts` in idem.toml"), "{error}");
        let bad = GivenSettings {
            allow_hosts: vec!["host:9090".into()],
            ..GivenSettings::default()
        };
        let error = resolve(&bad, upstream).unwrap_err();
        assert!(
            error.contains("--allow-host") && error.contains("port"),
            "{error}"
        );
    }
}
