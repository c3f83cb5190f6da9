//! Several servers in one PostgreSQL URL, written the way libpq, JDBC and
//! Patroni's guides write them, and `target_session_attrs`, which says which
//! of them to use.
//!
//! sqlx reads one host per URL: `postgres://u@h1:5432,h2:5432/db` fails in it
//! as an invalid port number, and it ignores `target_session_attrs`. So the
//! list is taken out of the URL here before sqlx sees it: sqlx parses a URL
//! with the first host only (every other setting is read once, as before),
//! and [`HostList::servers`] makes one set of options per host from it. Which
//! of those servers a connection goes to is decided in `connect`.
//!
//! Both of libpq's forms are read: hosts in the authority
//! (`h1:5432,[::1]:5433,h3`) and `?host=h1,h2&port=5432,5433` in the query.
//! A host without a port takes the URL's `port=` (or sqlx's default: `PGPORT`,
//! else 5432). A URL with one host and no `target_session_attrs` is left
//! exactly as it was written.

use std::fmt;

use idem_core::{Error, ErrorKind, StoreError};
use sqlx::postgres::PgConnectOptions;

/// Which server of the list a connection may use (libpq's
/// `target_session_attrs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum TargetSessionAttrs {
    /// The first server that accepts the connection.
    #[default]
    Any,
    /// One that accepts writes: `SHOW transaction_read_only` is `off`.
    ReadWrite,
    /// One that refuses writes: `SHOW transaction_read_only` is `on`.
    ReadOnly,
    /// One not in recovery: `pg_is_in_recovery()` is false.
    Primary,
    /// One in recovery (a standby): `pg_is_in_recovery()` is true.
    Standby,
    /// A standby if one answers, else any server.
    PreferStandby,
}

impl TargetSessionAttrs {
    fn parse(value: &str) -> Option<Self> {
        Some(match value {
            "any" => Self::Any,
            "read-write" => Self::ReadWrite,
            "read-only" => Self::ReadOnly,
            "primary" => Self::Primary,
            "standby" => Self::Standby,
            "prefer-standby" => Self::PreferStandby,
            _ => return None,
        })
    }

    /// The value as the URL writes it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Any => "any",
            Self::ReadWrite => "read-write",
            Self::ReadOnly => "read-only",
            Self::Primary => "primary",
            Self::Standby => "standby",
            Self::PreferStandby => "prefer-standby",
        }
    }
}

/// One server of the list: a host name, an IP address (IPv6 without its
/// brackets) or a Unix socket directory, and its port if the URL gave one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Host {
    pub(crate) name: String,
    pub(crate) port: Option<u16>,
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.name.contains(':'), self.port) {
            (true, Some(port)) => write!(f, "[{}]:{port}", self.name),
            (false, Some(port)) => write!(f, "{}:{port}", self.name),
            (_, None) => f.write_str(&self.name),
        }
    }
}

/// The servers a URL names, in the order they are tried, and which one to use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct HostList {
    pub(crate) hosts: Vec<Host>,
    pub(crate) target: TargetSessionAttrs,
}

impl HostList {
    /// One set of options per host: `base` (parsed from the URL with the
    /// first host) with the host and port replaced. A host without a port
    /// keeps `base`'s port, unless `base` took the first host's own port.
    pub(crate) fn servers(&self, base: &PgConnectOptions) -> Vec<PgConnectOptions> {
        self.hosts
            .iter()
            .map(|host| {
                let options = if host.name.starts_with('/') {
                    base.clone().socket(&host.name)
                } else {
                    base.clone().host(&host.name)
                };
                match host.port {
                    Some(port) => options.port(port),
                    None => options,
                }
            })
            .collect()
    }

    /// `h1:5432,h2:5433`, for messages (no user, no password).
    pub(crate) fn describe(&self) -> String {
        let hosts: Vec<String> = self.hosts.iter().map(Host::to_string).collect();
        hosts.join(",")
    }
}

/// Takes the host list and `target_session_attrs` out of `url`. Returns the
/// URL for sqlx (with the first host only, and without its port, so that
/// the URL's default port stays visible) and the list; `None` for a URL with
/// one host and no `target_session_attrs`, which is returned unchanged.
pub(crate) fn take_hosts(url: &str) -> Result<(String, Option<HostList>), Error> {
    let Some((scheme, rest)) = url.split_once("://") else {
        // Not a URL sqlx reads either; it says so itself.
        return Ok((url.to_owned(), None));
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let (path, query) = tail.split_once('?').unwrap_or((tail, ""));
    let (userinfo, host_text) = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => (Some(userinfo), hosts),
        None => (None, authority),
    };

    let mut target = None;
    let mut query_hosts = None;
    let mut query_ports = None;
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "target_session_attrs" => {
                target = Some(TargetSessionAttrs::parse(value).ok_or_else(|| {
                    config(format!(
                        "target_session_attrs={value:?} in the PostgreSQL URL is not understood: write any, read-write, read-only, primary, standby or prefer-standby"
                    ))
                })?);
            }
            "host" if value.contains(',') || value.contains("%2C") || value.contains("%2c") => {
                query_hosts = Some(percent_decoded(value));
            }
            "port" if value.contains(',') || value.contains("%2C") || value.contains("%2c") => {
                query_ports = Some(percent_decoded(value));
            }
            _ => kept.push(pair),
        }
    }

    let mut hosts = match &query_hosts {
        // libpq: the query's host list overrides the authority's.
        Some(list) => list
            .split(',')
            .enumerate()
            .map(|(i, name)| {
                if name.is_empty() {
                    return Err(config(format!(
                        "host {} of the PostgreSQL URL's host= list is empty; write host=host1,host2",
                        i + 1
                    )));
                }
                Ok(Host {
                    name: name.to_owned(),
                    port: None,
                })
            })
            .collect::<Result<Vec<_>, _>>()?,
        None => parse_authority_hosts(host_text)?,
    };
    if let Some(ports) = &query_ports {
        let ports: Vec<&str> = ports.split(',').collect();
        if ports.len() != 1 && ports.len() != hosts.len() {
            return Err(config(format!(
                "the PostgreSQL URL gives {} ports for {} hosts; give one port for all of them, or one per host in the same order",
                ports.len(),
                hosts.len()
            )));
        }
        for (i, host) in hosts.iter_mut().enumerate() {
            let text = ports[if ports.len() == 1 { 0 } else { i }];
            if !text.is_empty() {
                host.port = Some(parse_port(text, i, &host.name)?);
            }
        }
    }

    if hosts.len() <= 1 && target.is_none() && query_ports.is_none() && query_hosts.is_none() {
        return Ok((url.to_owned(), None));
    }
    if hosts.is_empty() {
        // `postgres:///db?target_session_attrs=...`: the default server,
        // as sqlx chooses it.
        let query = joined(&kept);
        let sqlx_url = format!("{scheme}://{}{path}{query}", userinfo_at(userinfo));
        return Ok((
            sqlx_url,
            Some(HostList {
                hosts,
                target: target.unwrap_or_default(),
            }),
        ));
    }

    let first = &hosts[0];
    let first_in_url = if first.name.starts_with('/') {
        // A socket directory: set on each server's options instead.
        String::new()
    } else if first.name.contains(':') {
        format!("[{}]", first.name)
    } else {
        first.name.clone()
    };
    let query = joined(&kept);
    let sqlx_url = format!(
        "{scheme}://{}{first_in_url}{path}{query}",
        userinfo_at(userinfo)
    );
    Ok((
        sqlx_url,
        Some(HostList {
            hosts,
            target: target.unwrap_or_default(),
        }),
    ))
}

fn userinfo_at(userinfo: Option<&str>) -> String {
    userinfo.map(|u| format!("{u}@")).unwrap_or_default()
}

fn joined(pairs: &[&str]) -> String {
    if pairs.is_empty() {
        String::new()
    } else {
        format!("?{}", pairs.join("&"))
    }
}

/// `h1:5432,[::1]:5433,h3` (the part of the authority after `@`).
fn parse_authority_hosts(text: &str) -> Result<Vec<Host>, Error> {
    if text.is_empty() {
        return Ok(Vec::new());
    }
    text.split(',')
        .enumerate()
        .map(|(i, item)| {
            let (name, port) = if let Some(bracketed) = item.strip_prefix('[') {
                let Some((name, after)) = bracketed.split_once(']') else {
                    return Err(config(format!(
                        "host {} of the PostgreSQL URL opens an IPv6 address with [ but does not close it; write [::1]:5432",
                        i + 1
                    )));
                };
                let port = match after {
                    "" => None,
                    _ => match after.strip_prefix(':') {
                        Some(port) => Some(port),
                        None => {
                            return Err(config(format!(
                                "host {} of the PostgreSQL URL has {after:?} after its IPv6 address; write [ADDRESS]:PORT",
                                i + 1
                            )));
                        }
                    },
                };
                (name.to_owned(), port)
            } else {
                match item.split_once(':') {
                    Some((name, port)) => (percent_decoded(name), Some(port)),
                    None => (percent_decoded(item), None),
                }
            };
            if name.is_empty() {
                return Err(config(format!(
                    "host {} of the PostgreSQL URL is empty; write postgres://user@host1:5432,host2:5432/database",
                    i + 1
                )));
            }
            let port = match port {
                None | Some("") => None,
                Some(text) => Some(parse_port(text, i, &name)?),
            };
            Ok(Host { name, port })
        })
        .collect()
}

fn parse_port(text: &str, index: usize, host: &str) -> Result<u16, Error> {
    match text.parse::<u16>() {
        Ok(port) if port != 0 => Ok(port),
        _ => Err(config(format!(
            "the port {text:?} of host {} ({host}) in the PostgreSQL URL is not a number from 1 to 65535",
            index + 1
        ))),
    }
}

fn config(message: String) -> Error {
    Error::Store(StoreError::new(ErrorKind::Config, message))
}

/// `%XX` decoded (host names and lists in a URL).
fn percent_decoded(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(high), Some(low)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push(u8::try_from(high * 16 + low).unwrap_or(b'?'));
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;

    fn host(name: &str, port: Option<u16>) -> Host {
        Host {
            name: name.to_owned(),
            port,
        }
    }

    #[test]
    fn one_host_and_no_target_leave_the_url_as_it_was() {
        for url in [
            "postgres://u:pw@h:5432/db?sslmode=disable",
            "postgres://u@[::1]:5432/db",
            "postgres:///db",
            "postgres://u@h/db?host=%2Fvar%2Frun%2Fpostgresql",
        ] {
            assert_eq!(take_hosts(url).unwrap(), (url.to_owned(), None), "{url}");
        }
    }

    #[test]
    fn hosts_in_the_authority_are_read_in_order_with_their_ports() {
        let (url, list) = take_hosts(
            "postgres://app:s3cret@db1:5433,[::1]:5434,db3/orders?target_session_attrs=read-write&sslmode=prefer",
        )
        .unwrap();
        assert_eq!(url, "postgres://app:s3cret@db1/orders?sslmode=prefer");
        let list = list.unwrap();
        assert_eq!(list.target, TargetSessionAttrs::ReadWrite);
        assert_eq!(
            list.hosts,
            [
                host("db1", Some(5433)),
                host("::1", Some(5434)),
                host("db3", None)
            ]
        );
        assert_eq!(list.describe(), "db1:5433,[::1]:5434,db3");
    }

    #[test]
    fn a_host_without_a_port_takes_the_urls_default_port() {
        let (url, list) = take_hosts("postgres://u@a:6000,b/db?port=7000").unwrap();
        let base = PgConnectOptions::from_str(&url).unwrap();
        let servers = list.unwrap().servers(&base);
        let at: Vec<(String, u16)> = servers
            .iter()
            .map(|o| (o.get_host().to_owned(), o.get_port()))
            .collect();
        assert_eq!(at, [("a".to_owned(), 6000), ("b".to_owned(), 7000)]);
        assert!(servers.iter().all(|o| o.get_database() == Some("db")));
        assert!(servers.iter().all(|o| o.get_username() == "u"));

        let (url, list) = take_hosts("postgres://u@[::1],[fe80::2]:5433/db").unwrap();
        let servers = list
            .unwrap()
            .servers(&PgConnectOptions::from_str(&url).unwrap());
        assert_eq!(servers[0].get_host(), "::1");
        assert_eq!(servers[0].get_port(), 5432);
        assert_eq!(servers[1].get_host(), "fe80::2");
        assert_eq!(servers[1].get_port(), 5433);
    }

    #[test]
    fn libpqs_query_form_is_read_too() {
        let (url, list) =
            take_hosts("postgres://u@/db?host=h1,h2&port=5432,5433&target_session_attrs=primary")
                .unwrap();
        assert_eq!(url, "postgres://u@h1/db");
        let list = list.unwrap();
        assert_eq!(list.target, TargetSessionAttrs::Primary);
        assert_eq!(list.hosts, [host("h1", Some(5432)), host("h2", Some(5433))]);
        // One port for every host: left for sqlx, as the hosts' default.
        let (url, list) = take_hosts("postgres://u@/db?host=h1%2Ch2&port=6432").unwrap();
        assert_eq!(url, "postgres://u@h1/db?port=6432");
        let servers = list
            .unwrap()
            .servers(&PgConnectOptions::from_str(&url).unwrap());
        assert!(servers.iter().all(|o| o.get_port() == 6432));
        assert_eq!(servers[1].get_host(), "h2");
        let err = take_hosts("postgres://u@/db?host=h1,h2,h3&port=1,2").unwrap_err();
        assert!(err.to_string().contains("2 ports for 3 hosts"), "{err}");
    }

    #[test]
    fn one_host_with_a_target_is_a_list_of_one() {
        let (url, list) =
            take_hosts("postgres://u@h:5433/db?target_session_attrs=standby").unwrap();
        assert_eq!(url, "postgres://u@h/db");
        let list = list.unwrap();
        assert_eq!(list.hosts, [host("h", Some(5433))]);
        assert_eq!(list.target, TargetSessionAttrs::Standby);
        for (text, target) in [
            ("any", TargetSessionAttrs::Any),
            ("read-only", TargetSessionAttrs::ReadOnly),
            ("prefer-standby", TargetSessionAttrs::PreferStandby),
        ] {
            let url = format!("postgres://u@h/db?target_session_attrs={text}");
            let list = take_hosts(&url).unwrap().1.unwrap();
            assert_eq!(list.target, target);
            assert_eq!(list.target.as_str(), text);
        }
    }

    #[test]
    fn a_target_without_hosts_is_for_the_default_server() {
        let (url, list) = take_hosts("postgres:///db?target_session_attrs=primary").unwrap();
        assert_eq!(url, "postgres:///db");
        let list = list.unwrap();
        assert!(list.hosts.is_empty());
        assert_eq!(list.target, TargetSessionAttrs::Primary);
    }

    #[test]
    fn mistakes_are_config_errors_that_do_not_show_the_password() {
        for (url, said) in [
            (
                "postgres://app:s3cret@h1:5432,h2:54x2/db",
                "port \"54x2\" of host 2 (h2)",
            ),
            (
                "postgres://app:s3cret@h1:5432,h2:70000/db",
                "from 1 to 65535",
            ),
            (
                "postgres://app:s3cret@h1,,h3/db",
                "host 2 of the PostgreSQL URL is empty",
            ),
            ("postgres://app:s3cret@[::1:5432,h2/db", "does not close it"),
            (
                "postgres://app:s3cret@[::1]5432,h2/db",
                "after its IPv6 address",
            ),
            (
                "postgres://app:s3cret@h1,h2/db?target_session_attrs=master",
                "target_session_attrs=\"master\"",
            ),
        ] {
            let err = take_hosts(url).unwrap_err();
            assert!(
                matches!(&err, Error::Store(e) if e.kind() == ErrorKind::Config),
                "{err:?}"
            );
            let text = err.to_string();
            assert!(text.contains(said), "{url}: {text}");
            assert!(!text.contains("s3cret"), "{text}");
        }
    }

    #[test]
    fn the_password_stays_where_sqlx_reads_it() {
        let (url, _) = take_hosts("postgres://app:p%40ss@h1:1,h2:2/db").unwrap();
        let base = PgConnectOptions::from_str(&url).unwrap();
        let servers = take_hosts("postgres://app:p%40ss@h1:1,h2:2/db")
            .unwrap()
            .1
            .unwrap()
            .servers(&base);
        assert_eq!(servers.len(), 2);
        assert_eq!(servers[1].get_host(), "h2");
        assert_eq!(servers[1].get_port(), 2);
        assert_eq!(servers[1].get_username(), "app");
    }
}
