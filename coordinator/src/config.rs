//! Settings: defaults, then a TOML file, then environment variables, then
//! command-line flags (each overrides the one before).

use serde::Deserialize;
use std::path::PathBuf;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read config file {0}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error("invalid config file {0}: {1}")]
    Parse(PathBuf, toml::de::Error),
    #[error("invalid value {value:?} for {name}: {reason}")]
    Value {
        name: String,
        value: String,
        reason: String,
    },
    #[error("unknown flag {0} (see --help)")]
    UnknownFlag(String),
    #[error("flag {0} needs a value")]
    MissingValue(String),
    #[error("auth = \"scram\" needs users_file")]
    ScramWithoutUsers,
    #[error("tls = \"{0}\" needs tls_cert_file and tls_key_file")]
    TlsWithoutCertificate(&'static str),
    #[error("server_tls_cert_file and server_tls_key_file go together: set both or neither")]
    ServerCertificateHalf,
}

/// Whether clients may or must talk TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TlsMode {
    /// SSLRequest is answered 'N': plain connections only.
    Disable,
    /// TLS for the clients that ask for it (sslmode=prefer or stronger).
    Allow,
    /// TLS only: a client's plain startup is refused (28000).
    Require,
}

impl TlsMode {
    pub fn name(self) -> &'static str {
        match self {
            TlsMode::Disable => "disable",
            TlsMode::Allow => "allow",
            TlsMode::Require => "require",
        }
    }
}

/// Whether the coordinator speaks TLS to the nodes over TCP, and what it
/// checks, as libpq's `sslmode` (Unix-domain sockets stay plain).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ServerTlsMode {
    /// Plain connections only.
    Disable,
    /// TLS when the server offers it, else plain; no certificate checked.
    Prefer,
    /// TLS or no connection; the certificate is checked only when
    /// server_tls_ca_file is set (as libpq with a root certificate).
    Require,
    /// TLS, with a certificate signed by server_tls_ca_file.
    VerifyCa,
    /// As verify-ca, and the certificate names the server's host.
    VerifyFull,
}

impl ServerTlsMode {
    pub fn name(self) -> &'static str {
        match self {
            ServerTlsMode::Disable => "disable",
            ServerTlsMode::Prefer => "prefer",
            ServerTlsMode::Require => "require",
            ServerTlsMode::VerifyCa => "verify-ca",
            ServerTlsMode::VerifyFull => "verify-full",
        }
    }
}

/// How clients prove who they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// SCRAM-SHA-256 against the users file.
    Scram,
    /// The metadata node authenticates the client (its messages are relayed).
    Passthrough,
    /// Anyone may connect as anyone. Only when configured explicitly.
    Trust,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address clients connect to.
    pub listen: String,
    /// The metadata node (host:port); workers are found in its catalog.
    pub metadata: String,
    pub auth: AuthMode,
    /// `"user" "password-or-SCRAM-verifier"` lines (pgbouncer's userlist format).
    pub users_file: Option<PathBuf>,
    /// Password for server connections when the servers ask for one.
    pub server_password: Option<String>,
    /// Folder of the Unix-domain sockets of servers on this machine: when
    /// set, connections to servers on 127.0.0.1 use them instead of TCP.
    pub server_socket_dir: Option<PathBuf>,
    /// The user that reads the shard map from the metadata node.
    pub catalog_user: String,
    /// Most server connections per node, database and user.
    pub pool_size: usize,
    /// Seconds a pooled server connection may stay idle before it is
    /// closed (0: never), so that idle pools keep no database busy.
    pub server_idle_timeout: u64,
    /// Seconds a client has from connecting to being logged in (startup
    /// and authentication), as PostgreSQL's authentication_timeout.
    pub authentication_timeout: u64,
    /// Most clients connected at once (logging in included); more are
    /// refused with PostgreSQL's 53300.
    pub max_clients: usize,
    /// Largest client message accepted, in bytes.
    pub max_message_bytes: usize,
    /// Address of the Prometheus /metrics endpoint ("" turns it off).
    pub metrics_listen: String,
    /// Tries of a statement rejected with WrongShard (the first included).
    pub wrong_shard_tries: u32,
    /// Parsed statements remembered (by text).
    pub statement_cache_size: usize,
    /// "text" or "json".
    pub log_format: String,
    /// Event loops serving clients (0: one per core). One by default:
    /// measured faster on this 2-core machine, where pgbench and the
    /// servers need the other core.
    pub threads: usize,
    /// Autocommit single-shard reads of many clients share pipelined
    /// server connections (multiplex.rs).
    pub multiplex: bool,
    /// Shared connections per server, database, user and settings for
    /// multiplexed reads.
    pub multiplex_connections: usize,
    /// Milliseconds a statement of a transaction on several nodes may wait
    /// for a lock before the coordinator takes it for a deadlock across
    /// nodes (which no node's own detector sees) and cancels it with
    /// 40P01 (0: never).
    pub distributed_deadlock_timeout: u64,
    /// Microseconds an event loop keeps polling its sockets after a send
    /// instead of sleeping (0: never); see net/busy_poll.rs.
    pub busy_poll: u64,
    /// TLS with clients.
    pub tls: TlsMode,
    /// PEM certificate chain (the coordinator's certificate first).
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of that certificate.
    pub tls_key_file: Option<PathBuf>,
    /// TLS with the nodes over TCP.
    pub server_tls_sslmode: ServerTlsMode,
    /// PEM certificates that sign the nodes' certificates.
    pub server_tls_ca_file: Option<PathBuf>,
    /// PEM certificate (and key) shown to nodes that ask for one
    /// (pg_hba's `clientcert` or `cert`).
    pub server_tls_cert_file: Option<PathBuf>,
    pub server_tls_key_file: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            listen: "127.0.0.1:6432".into(),
            metadata: "127.0.0.1:54320".into(),
            auth: AuthMode::Passthrough,
            users_file: None,
            server_password: None,
            server_socket_dir: None,
            catalog_user: "postgres".into(),
            pool_size: 20,
            server_idle_timeout: 600,
            authentication_timeout: 60,
            max_clients: 1000,
            max_message_bytes: 64 << 20,
            metrics_listen: "127.0.0.1:9932".into(),
            wrong_shard_tries: 3,
            statement_cache_size: 10_000,
            log_format: "text".into(),
            threads: 1,
            multiplex: true,
            multiplex_connections: 1,
            distributed_deadlock_timeout: 2000,
            busy_poll: 50,
            tls: TlsMode::Disable,
            tls_cert_file: None,
            tls_key_file: None,
            server_tls_sslmode: ServerTlsMode::Prefer,
            server_tls_ca_file: None,
            server_tls_cert_file: None,
            server_tls_key_file: None,
        }
    }
}

pub const USAGE: &str = "\
pg_shard_coordinator: routes PostgreSQL clients to a pg_shard cluster

Options (environment variable in brackets; a TOML config file takes the same
names with underscores):
  --config FILE            [PGSHARD_COORDINATOR_CONFIG]
  --listen HOST:PORT       [PGSHARD_COORDINATOR_LISTEN]      default 127.0.0.1:6432
  --metadata HOST:PORT     [PGSHARD_COORDINATOR_METADATA]    default 127.0.0.1:54320
  --auth scram|passthrough|trust [PGSHARD_COORDINATOR_AUTH]  default passthrough
  --users-file FILE        [PGSHARD_COORDINATOR_USERS_FILE]
  --server-password PW     [PGSHARD_COORDINATOR_SERVER_PASSWORD]
  --catalog-user NAME      [PGSHARD_COORDINATOR_CATALOG_USER] default postgres
  --server-socket-dir DIR  [PGSHARD_COORDINATOR_SERVER_SOCKET_DIR] Unix sockets
                           of servers on 127.0.0.1 (default: TCP)
  --pool-size N            [PGSHARD_COORDINATOR_POOL_SIZE]   default 20
  --server-idle-timeout S  [PGSHARD_COORDINATOR_SERVER_IDLE_TIMEOUT] default 600:
                           seconds before an idle pooled server connection
                           closes (0: never)
  --authentication-timeout S [PGSHARD_COORDINATOR_AUTHENTICATION_TIMEOUT]
                           default 60: seconds from connecting to logged in
  --max-clients N          [PGSHARD_COORDINATOR_MAX_CLIENTS]  default 1000
  --max-message-bytes N    [PGSHARD_COORDINATOR_MAX_MESSAGE_BYTES]
  --metrics-listen ADDR    [PGSHARD_COORDINATOR_METRICS_LISTEN] default 127.0.0.1:9932
  --wrong-shard-tries N    [PGSHARD_COORDINATOR_WRONG_SHARD_TRIES] default 3
  --statement-cache-size N [PGSHARD_COORDINATOR_STATEMENT_CACHE_SIZE]
  --log-format text|json   [PGSHARD_COORDINATOR_LOG_FORMAT]
  --threads N              [PGSHARD_COORDINATOR_THREADS]     default 1 (0: one per core)
  --multiplex on|off       [PGSHARD_COORDINATOR_MULTIPLEX]   default on: autocommit
                           single-shard reads share pipelined server connections
  --multiplex-connections N [PGSHARD_COORDINATOR_MULTIPLEX_CONNECTIONS] default 1:
                           shared connections per server (and database, user)
  --distributed-deadlock-timeout MS [PGSHARD_COORDINATOR_DISTRIBUTED_DEADLOCK_TIMEOUT]
                           default 2000: a statement of a transaction on several
                           nodes waiting this long for a lock is canceled with
                           40P01 (a deadlock across nodes); 0: never
  --busy-poll US           [PGSHARD_COORDINATOR_BUSY_POLL]   default 50: after a send,
                           poll for the answer this many microseconds (at most
                           10000) while no other task wants the core, instead of
                           sleeping; 0: never
  --tls disable|allow|require [PGSHARD_COORDINATOR_TLS] default disable: TLS
                           with clients that ask (allow), or only TLS (require)
  --tls-cert-file FILE     [PGSHARD_COORDINATOR_TLS_CERT_FILE] PEM certificate chain
  --tls-key-file FILE      [PGSHARD_COORDINATOR_TLS_KEY_FILE]  PEM private key
  --server-tls-sslmode disable|prefer|require|verify-ca|verify-full
                           [PGSHARD_COORDINATOR_SERVER_TLS_SSLMODE] default prefer:
                           TLS with the nodes over TCP, as libpq's sslmode
  --server-tls-ca-file FILE [PGSHARD_COORDINATOR_SERVER_TLS_CA_FILE] PEM certificates
                           that sign the nodes' (verify-ca, verify-full)
  --server-tls-cert-file FILE [PGSHARD_COORDINATOR_SERVER_TLS_CERT_FILE] and
  --server-tls-key-file FILE [PGSHARD_COORDINATOR_SERVER_TLS_KEY_FILE]: a client
                           certificate for nodes that ask for one
";

/// Longest busy-polling window (µs): beyond it polling is spinning.
const MOST_BUSY_POLL: u64 = 10_000;
const BUSY_POLL_RANGE: &str = "expected microseconds from 0 (never) to 10000";

/// The settings names, as flags use them (without the leading dashes).
const NAMES: [&str; 28] = [
    "listen",
    "metadata",
    "auth",
    "users-file",
    "server-password",
    "catalog-user",
    "server-socket-dir",
    "pool-size",
    "server-idle-timeout",
    "distributed-deadlock-timeout",
    "authentication-timeout",
    "max-clients",
    "max-message-bytes",
    "metrics-listen",
    "wrong-shard-tries",
    "statement-cache-size",
    "log-format",
    "threads",
    "multiplex",
    "multiplex-connections",
    "busy-poll",
    "tls",
    "tls-cert-file",
    "tls-key-file",
    "server-tls-sslmode",
    "server-tls-ca-file",
    "server-tls-cert-file",
    "server-tls-key-file",
];

impl Config {
    /// Builds the settings from `args` (without the program name) and the
    /// environment. `Ok(None)` means --help was asked for.
    pub fn load(
        args: &[String],
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<Config>, ConfigError> {
        let mut flags = Vec::new();
        let mut config_file = env("PGSHARD_COORDINATOR_CONFIG").map(PathBuf::from);
        let mut rest = args.iter();
        while let Some(arg) = rest.next() {
            if arg == "--help" || arg == "-h" {
                return Ok(None);
            }
            let (name, inline) = match arg.strip_prefix("--") {
                Some(flag) => match flag.split_once('=') {
                    Some((name, value)) => (name.to_owned(), Some(value.to_owned())),
                    None => (flag.to_owned(), None),
                },
                None => return Err(ConfigError::UnknownFlag(arg.clone())),
            };
            if name != "config" && !NAMES.contains(&name.as_str()) {
                return Err(ConfigError::UnknownFlag(arg.clone()));
            }
            let value = match inline {
                Some(value) => value,
                None => rest
                    .next()
                    .cloned()
                    .ok_or_else(|| ConfigError::MissingValue(arg.clone()))?,
            };
            if name == "config" {
                config_file = Some(PathBuf::from(value));
            } else {
                flags.push((name, value));
            }
        }
        let mut config = match config_file {
            Some(path) => {
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| ConfigError::Read(path.clone(), e))?;
                toml::from_str(&text).map_err(|e| ConfigError::Parse(path, e))?
            }
            None => Config::default(),
        };
        for name in NAMES {
            let variable = format!(
                "PGSHARD_COORDINATOR_{}",
                name.replace('-', "_").to_uppercase()
            );
            if let Some(value) = env(&variable) {
                config.set(name, &value)?;
            }
        }
        for (name, value) in flags {
            config.set(&name, &value)?;
        }
        if config.auth == AuthMode::Scram && config.users_file.is_none() {
            return Err(ConfigError::ScramWithoutUsers);
        }
        if config.tls != TlsMode::Disable
            && (config.tls_cert_file.is_none() || config.tls_key_file.is_none())
        {
            return Err(ConfigError::TlsWithoutCertificate(config.tls.name()));
        }
        if config.server_tls_cert_file.is_some() != config.server_tls_key_file.is_some() {
            return Err(ConfigError::ServerCertificateHalf);
        }
        config.check_ranges()?;
        Ok(Some(config))
    }

    /// How long an event loop polls after a send (`busy_poll`).
    pub fn busy_poll_window(&self) -> std::time::Duration {
        std::time::Duration::from_micros(self.busy_poll)
    }

    /// Ranges that a config file's values must keep too (flags and
    /// environment variables are checked as they are read).
    fn check_ranges(&self) -> Result<(), ConfigError> {
        let bad = |name: &str, value: String, reason: &str| ConfigError::Value {
            name: name.to_owned(),
            value,
            reason: reason.to_owned(),
        };
        if self.busy_poll > MOST_BUSY_POLL {
            return Err(bad(
                "busy_poll",
                self.busy_poll.to_string(),
                BUSY_POLL_RANGE,
            ));
        }
        if self.pool_size == 0 {
            return Err(bad("pool_size", "0".into(), "expected a positive integer"));
        }
        Ok(())
    }

    fn set(&mut self, name: &str, value: &str) -> Result<(), ConfigError> {
        let bad = |reason: &str| ConfigError::Value {
            name: name.to_owned(),
            value: value.to_owned(),
            reason: reason.to_owned(),
        };
        let number = || {
            value
                .parse::<usize>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| bad("expected a positive integer"))
        };
        match name {
            "listen" => self.listen = value.to_owned(),
            "metadata" => self.metadata = value.to_owned(),
            "auth" => {
                self.auth = match value {
                    "scram" => AuthMode::Scram,
                    "passthrough" => AuthMode::Passthrough,
                    "trust" => AuthMode::Trust,
                    _ => return Err(bad("expected scram, passthrough or trust")),
                }
            }
            "users-file" => self.users_file = Some(PathBuf::from(value)),
            "tls" => {
                self.tls = match value {
                    "disable" => TlsMode::Disable,
                    "allow" => TlsMode::Allow,
                    "require" => TlsMode::Require,
                    _ => return Err(bad("expected disable, allow or require")),
                }
            }
            "server-tls-sslmode" => {
                self.server_tls_sslmode = match value {
                    "disable" => ServerTlsMode::Disable,
                    "prefer" => ServerTlsMode::Prefer,
                    "require" => ServerTlsMode::Require,
                    "verify-ca" => ServerTlsMode::VerifyCa,
                    "verify-full" => ServerTlsMode::VerifyFull,
                    _ => {
                        return Err(bad(
                            "expected disable, prefer, require, verify-ca or verify-full",
                        ))
                    }
                }
            }
            "server-tls-ca-file" => self.server_tls_ca_file = Some(PathBuf::from(value)),
            "server-tls-cert-file" => self.server_tls_cert_file = Some(PathBuf::from(value)),
            "server-tls-key-file" => self.server_tls_key_file = Some(PathBuf::from(value)),
            "tls-cert-file" => self.tls_cert_file = Some(PathBuf::from(value)),
            "tls-key-file" => self.tls_key_file = Some(PathBuf::from(value)),
            "server-password" => self.server_password = Some(value.to_owned()),
            "catalog-user" => self.catalog_user = value.to_owned(),
            "server-socket-dir" => self.server_socket_dir = Some(PathBuf::from(value)),
            "pool-size" => self.pool_size = number()?,
            "authentication-timeout" => self.authentication_timeout = number()? as u64,
            "max-clients" => self.max_clients = number()?,
            "server-idle-timeout" => {
                self.server_idle_timeout = value
                    .parse()
                    .map_err(|_| bad("expected a number of seconds (0: never)"))?
            }
            "max-message-bytes" => self.max_message_bytes = number()?.max(1024),
            "distributed-deadlock-timeout" => {
                self.distributed_deadlock_timeout = value
                    .parse()
                    .map_err(|_| bad("expected a number of milliseconds (0: never)"))?
            }
            "metrics-listen" => self.metrics_listen = value.to_owned(),
            "wrong-shard-tries" => {
                self.wrong_shard_tries = u32::try_from(number()?).map_err(|_| bad("too large"))?
            }
            "statement-cache-size" => self.statement_cache_size = number()?,
            "threads" => {
                self.threads = value
                    .parse()
                    .map_err(|_| bad("expected a number of threads (0: one per core)"))?
            }
            "multiplex" => {
                self.multiplex = match value {
                    "on" | "true" | "yes" | "1" => true,
                    "off" | "false" | "no" | "0" => false,
                    _ => return Err(bad("expected on or off")),
                }
            }
            "multiplex-connections" => self.multiplex_connections = number()?,
            "busy-poll" => {
                self.busy_poll = value
                    .parse()
                    .ok()
                    .filter(|us| *us <= MOST_BUSY_POLL)
                    .ok_or_else(|| bad(BUSY_POLL_RANGE))?
            }
            "log-format" => match value {
                "text" | "json" => self.log_format = value.to_owned(),
                _ => return Err(bad("expected text or json")),
            },
            _ => return Err(ConfigError::UnknownFlag(format!("--{name}"))),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn flags_override_environment_override_defaults() {
        let env = |name: &str| match name {
            "PGSHARD_COORDINATOR_LISTEN" => Some("127.0.0.1:7000".to_string()),
            "PGSHARD_COORDINATOR_POOL_SIZE" => Some("5".to_string()),
            _ => None,
        };
        let config = Config::load(&args(&["--listen", "127.0.0.1:7001"]), &env)
            .unwrap()
            .unwrap();
        assert_eq!(config.listen, "127.0.0.1:7001");
        assert_eq!(config.pool_size, 5);
        assert_eq!(config.metadata, "127.0.0.1:54320");
        assert_eq!(config.auth, AuthMode::Passthrough);
        assert!(config.multiplex);
        let off = Config::load(&args(&["--multiplex=off"]), &env)
            .unwrap()
            .unwrap();
        assert!(!off.multiplex);
        assert_eq!(config.busy_poll, 50);
        let polling = Config::load(&args(&["--busy-poll", "0"]), &env)
            .unwrap()
            .unwrap();
        assert_eq!(polling.busy_poll, 0);
    }

    #[test]
    fn bad_values_are_refused() {
        let none = |_: &str| None;
        assert!(Config::load(&args(&["--pool-size", "0"]), &none).is_err());
        assert!(Config::load(&args(&["--auth", "md5"]), &none).is_err());
        assert!(Config::load(&args(&["--auth", "scram"]), &none).is_err());
        assert!(Config::load(&args(&["--bogus", "1"]), &none).is_err());
        assert!(Config::load(&args(&["--listen"]), &none).is_err());
        assert!(Config::load(&args(&["--multiplex", "maybe"]), &none).is_err());
        assert!(Config::load(&args(&["--busy-poll", "-1"]), &none).is_err());
        assert!(Config::load(&args(&["--busy-poll", "20000"]), &none).is_err());
        assert!(Config::load(&args(&["--tls", "prefer"]), &none).is_err());
        let no_key = Config::load(
            &args(&["--tls", "require", "--tls-cert-file", "c.pem"]),
            &none,
        );
        assert!(matches!(
            no_key,
            Err(ConfigError::TlsWithoutCertificate("require"))
        ));
    }

    #[test]
    fn tls_settings() {
        let none = |_: &str| None;
        let config = Config::load(
            &args(&[
                "--tls=allow",
                "--tls-cert-file",
                "/etc/ssl/c.pem",
                "--tls-key-file",
                "/etc/ssl/k.pem",
            ]),
            &none,
        )
        .unwrap()
        .unwrap();
        assert_eq!(config.tls, TlsMode::Allow);
        assert_eq!(config.tls_key_file, Some(PathBuf::from("/etc/ssl/k.pem")));
        let default = Config::load(&[], &none).unwrap().unwrap();
        assert_eq!(default.tls, TlsMode::Disable);
        assert_eq!(default.server_tls_sslmode, ServerTlsMode::Prefer);
    }

    #[test]
    fn server_tls_settings() {
        let none = |_: &str| None;
        let config = Config::load(
            &args(&[
                "--server-tls-sslmode=verify-full",
                "--server-tls-ca-file=/ca.pem",
            ]),
            &none,
        )
        .unwrap()
        .unwrap();
        assert_eq!(config.server_tls_sslmode, ServerTlsMode::VerifyFull);
        let bad = Config::load(&args(&["--server-tls-sslmode=allow"]), &none)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(bad.contains("expected disable, prefer"), "{bad}");
        let half = Config::load(&args(&["--server-tls-cert-file=/c.pem"]), &none)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(half.contains("set both or neither"), "{half}");
        let from_file: Config = toml::from_str("server_tls_sslmode = \"verify-ca\"").unwrap();
        assert_eq!(from_file.server_tls_sslmode, ServerTlsMode::VerifyCa);
    }

    #[test]
    fn config_file_is_read() {
        let dir = std::env::temp_dir().join(format!("pgshard-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("coordinator.toml");
        std::fs::write(&file, "listen = \"127.0.0.1:7100\"\nauth = \"trust\"\n").unwrap();
        let none = |_: &str| None;
        let config = Config::load(&args(&["--config", file.to_str().unwrap()]), &none)
            .unwrap()
            .unwrap();
        assert_eq!(config.listen, "127.0.0.1:7100");
        assert_eq!(config.auth, AuthMode::Trust);
        std::fs::write(&file, "listen = 5\n").unwrap();
        assert!(Config::load(&args(&["--config", file.to_str().unwrap()]), &none).is_err());
        std::fs::write(&file, "busy_poll = 10000000\n").unwrap();
        assert!(Config::load(&args(&["--config", file.to_str().unwrap()]), &none).is_err());
        std::fs::write(&file, "pool_size = 0\n").unwrap();
        assert!(Config::load(&args(&["--config", file.to_str().unwrap()]), &none).is_err());
    }
}
