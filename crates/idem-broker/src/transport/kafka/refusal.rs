//! Why librdkafka could not talk to the brokers, in words that say what to
//! change. librdkafka reports a refused TLS handshake or SASL exchange only
//! as the reason of an error event or a log line (a connection the broker
//! closed at once is only logged), while the request that waited for the
//! broker fails with a bare timeout; the consumer and the publisher keep the
//! reasons and explain the most telling one when they cannot reach the
//! brokers at start-up. The reasons name brokers and mechanisms, never a
//! password.

use std::sync::Mutex;

use rdkafka::ClientConfig;
use rdkafka::config::RDKafkaLogLevel;

/// Makes librdkafka report connection failures of level info too (a
/// connection the broker closed at once is logged at that level), whatever
/// the tracing subscriber's level was when `config` was made: [`Reasons::log`]
/// keeps them, and `tracing` still filters what is printed.
pub(crate) fn report_failures(config: &mut ClientConfig) {
    if (config.log_level as i32) < (RDKafkaLogLevel::Info as i32) {
        config.set_log_level(RDKafkaLogLevel::Info);
    }
}

/// How many reasons are kept (the latest).
const KEPT: usize = 16;

/// The reasons librdkafka gave for its errors, oldest first.
#[derive(Debug, Default)]
pub(crate) struct Reasons(Mutex<Vec<String>>);

impl Reasons {
    /// Keeps `reason`. A reason given again moves to the newest place
    /// instead of taking another: librdkafka repeats "1/1 brokers are down"
    /// many times a second, and the repeats would push out the one reason
    /// that says why (a certificate that did not verify, refused
    /// credentials).
    pub(crate) fn record(&self, reason: &str) {
        let mut reasons = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(at) = reasons.iter().position(|kept| kept == reason) {
            let again = reasons.remove(at);
            reasons.push(again);
            return;
        }
        if reasons.len() == KEPT {
            reasons.remove(0);
        }
        reasons.push(reason.to_owned());
    }

    /// A librdkafka log line: a connection's failure (`FAIL`) is kept as a
    /// reason; every line goes to `tracing` as librdkafka's own would.
    pub(crate) fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        if facility == "FAIL" {
            self.record(message);
        }
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => {
                tracing::error!(target: "librdkafka", "librdkafka: {facility} {message}")
            }
            RDKafkaLogLevel::Warning => {
                tracing::warn!(target: "librdkafka", "librdkafka: {facility} {message}")
            }
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(target: "librdkafka", "librdkafka: {facility} {message}")
            }
            RDKafkaLogLevel::Debug => {
                tracing::debug!(target: "librdkafka", "librdkafka: {facility} {message}")
            }
        }
    }

    /// The most telling refusal among the reasons kept, explained.
    pub(crate) fn refusal(&self) -> Option<Refusal> {
        let reasons = self.0.lock().unwrap_or_else(|e| e.into_inner());
        reasons
            .iter()
            .filter_map(|reason| explain(reason))
            .min_by_key(|refusal| refusal.kind)
    }
}

/// What kind of refusal, the most telling first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum RefusalKind {
    /// The broker refused the SASL credentials.
    Authentication,
    /// The broker's certificate did not verify.
    Certificate,
    /// The broker requires a client certificate the client did not present.
    ClientCertificate,
    /// A client without TLS reached a TLS listener.
    TlsRequired,
    /// Another TLS failure.
    Tls,
}

impl RefusalKind {
    /// Whether trying longer cannot help: the broker answered, and refused.
    /// A closed connection or another TLS failure may also be a broker on
    /// its way up or down.
    pub(crate) fn is_final(self) -> bool {
        matches!(
            self,
            Self::Authentication | Self::Certificate | Self::ClientCertificate
        )
    }
}

/// A refusal and what it means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub(crate) kind: RefusalKind,
    pub(crate) message: String,
}

/// What librdkafka's `reason` means, when it is a refusal.
pub(crate) fn explain(reason: &str) -> Option<Refusal> {
    let lower = reason.to_ascii_lowercase();
    let (kind, message) = if lower.contains("sasl")
        && lower.contains("authentication")
        && (lower.contains("failed") || lower.contains("invalid credentials"))
    {
        (
            RefusalKind::Authentication,
            format!(
                "authentication failed: the broker refused the SASL credentials ({reason}); check sasl.mechanism, sasl.username and sasl.password"
            ),
        )
    } else if lower.contains("certificate verify failed") || lower.contains("could not be verified")
    {
        (
            RefusalKind::Certificate,
            format!(
                "the TLS certificate of the Kafka broker did not verify ({reason}); ssl.ca.location must name the PEM file of the CA that signed the brokers' certificates, and the brokers must be reached by a name their certificates hold"
            ),
        )
    } else if lower.contains("certificate required") {
        (
            RefusalKind::ClientCertificate,
            format!(
                "the broker requires a client certificate ({reason}); give ssl.certificate.location and ssl.key.location"
            ),
        )
    } else if lower.contains("incorrect security.protocol")
        || lower.contains("connecting to a ssl listener")
        || (lower.contains("disconnected")
            && lower.contains("state apiversion_query")
            && !lower.contains("ssl://"))
    {
        (
            RefusalKind::TlsRequired,
            format!(
                "the broker closed the connection before answering, as a TLS listener does to a client that speaks no TLS ({reason}); set security.protocol=SSL (SASL_SSL with SASL)"
            ),
        )
    } else if lower.contains("ssl handshake failed") {
        (
            RefusalKind::Tls,
            format!(
                "TLS failed ({reason}); check ssl.ca.location, ssl.certificate.location and ssl.key.location, and that the brokers speak TLS on that port"
            ),
        )
    } else {
        return None;
    };
    Some(Refusal { kind, message })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn librdkafkas_reasons_are_explained() {
        for (reason, kind) in [
            (
                "sasl_ssl://127.0.0.1:9093/bootstrap: SASL authentication error: SASL SCRAM authentication failed (after 3ms in state AUTH_REQ)",
                RefusalKind::Authentication,
            ),
            (
                "ssl://127.0.0.1:9093/bootstrap: SSL handshake failed: error:0A000086:SSL routines::certificate verify failed: broker certificate could not be verified, verify that ssl.ca.location is correctly configured",
                RefusalKind::Certificate,
            ),
            (
                "127.0.0.1:9093/bootstrap: Disconnected while requesting ApiVersion: might be caused by incorrect security.protocol configuration (connecting to a SSL listener?) or broker version is < 0.10",
                RefusalKind::TlsRequired,
            ),
            (
                "127.0.0.1:9093/bootstrap: Disconnected: connection closed by peer: receive 0 after POLLIN (after 0ms in state APIVERSION_QUERY)",
                RefusalKind::TlsRequired,
            ),
            (
                "ssl://127.0.0.1:9093/bootstrap: Receive failed: ssl/record/rec_layer_s3.c:918:ssl3_read_bytes error:0A00045C:SSL routines::tlsv13 alert certificate required: SSL alert number 116 (after 0ms in state APIVERSION_QUERY)",
                RefusalKind::ClientCertificate,
            ),
            (
                "ssl://127.0.0.1:9093/bootstrap: SSL handshake failed: error:0A00010B:SSL routines::wrong version number",
                RefusalKind::Tls,
            ),
        ] {
            let refusal = explain(reason).unwrap_or_else(|| panic!("{reason}"));
            assert_eq!(refusal.kind, kind, "{reason}");
            assert!(refusal.message.contains(reason));
        }
        assert_eq!(explain("Connection refused"), None);
        // A TLS client whose connection is closed at its first request was
        // not refused for speaking no TLS.
        assert_eq!(
            explain(
                "ssl://b:9093/bootstrap: Disconnected: connection closed by peer: receive 0 after POLLIN (after 0ms in state APIVERSION_QUERY)"
            ),
            None
        );
    }

    #[test]
    fn the_most_telling_reason_is_chosen() {
        let reasons = Reasons::default();
        reasons.record("127.0.0.1:9092/bootstrap: Connect to ipv4#127.0.0.1:9092 failed");
        assert_eq!(reasons.refusal(), None);
        reasons.record("SSL handshake failed: unexpected eof");
        reasons.record("SASL authentication error: SASL SCRAM authentication failed");
        reasons.record("SSL handshake failed: unexpected eof");
        assert_eq!(
            reasons.refusal().map(|r| r.kind),
            Some(RefusalKind::Authentication)
        );
        for _ in 0..10 * KEPT {
            reasons.record("1/1 brokers are down");
        }
        assert_eq!(
            reasons.refusal().map(|r| r.kind),
            Some(RefusalKind::Authentication),
            "a repeated reason does not push out the telling one"
        );
        for i in 0..KEPT {
            reasons.record(&format!("later {i}"));
        }
        assert_eq!(reasons.refusal(), None, "only the latest are kept");
    }
}
