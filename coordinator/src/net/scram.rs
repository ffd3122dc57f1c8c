//! SCRAM-SHA-256 (RFC 5802 / 7677) as PostgreSQL uses it: the server side
//! for clients, the client side for servers that ask the coordinator for a
//! password. Over TLS, SCRAM-SHA-256-PLUS binds the exchange to the
//! session with the server's certificate (`tls-server-end-point`,
//! net/channel_binding.rs), both ways.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::{Digest, Sha256};
use thiserror::Error;

type HmacSha256 = Hmac<Sha256>;

pub const MECHANISM: &str = "SCRAM-SHA-256";
pub const MECHANISM_PLUS: &str = "SCRAM-SHA-256-PLUS";

/// Whether a SASL mechanism list (AuthenticationSASL's, NUL-terminated
/// names) names `mechanism`.
pub fn offers(list: &[u8], mechanism: &str) -> bool {
    list.split(|b| *b == 0).any(|m| m == mechanism.as_bytes())
}
const DEFAULT_ITERATIONS: u32 = 4096;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ScramError {
    #[error("malformed SCRAM message")]
    Malformed,
    #[error("channel binding is not supported")]
    ChannelBinding,
    #[error("SCRAM channel binding negotiation error: the client supports channel binding but thinks the server does not, and it does")]
    BindingDowngrade,
    #[error("SCRAM channel binding check failed")]
    BindingMismatch,
    #[error("nonce mismatch")]
    Nonce,
    #[error("password authentication failed")]
    WrongProof,
    #[error("invalid SCRAM verifier")]
    BadVerifier,
    #[error("server signature mismatch")]
    ServerSignature,
}

/// What the server keeps of a password: PostgreSQL's
/// `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verifier {
    pub iterations: u32,
    pub salt: Vec<u8>,
    pub stored_key: [u8; 32],
    pub server_key: [u8; 32],
}

impl Verifier {
    /// A verifier for a plain-text password, with a fresh random salt.
    pub fn from_password(password: &str) -> Verifier {
        let mut salt = vec![0u8; 16];
        rand::thread_rng().fill_bytes(&mut salt);
        let salted = salted_password(password.as_bytes(), &salt, DEFAULT_ITERATIONS);
        let client_key = hmac(&salted, b"Client Key");
        Verifier {
            iterations: DEFAULT_ITERATIONS,
            salt,
            stored_key: Sha256::digest(client_key).into(),
            server_key: hmac(&salted, b"Server Key"),
        }
    }

    /// Reads PostgreSQL's verifier text.
    pub fn parse(text: &str) -> Result<Verifier, ScramError> {
        let rest = text
            .strip_prefix("SCRAM-SHA-256$")
            .ok_or(ScramError::BadVerifier)?;
        let (parameters, keys) = rest.split_once('$').ok_or(ScramError::BadVerifier)?;
        let (iterations, salt) = parameters.split_once(':').ok_or(ScramError::BadVerifier)?;
        let (stored, server) = keys.split_once(':').ok_or(ScramError::BadVerifier)?;
        let key = |text: &str| -> Result<[u8; 32], ScramError> {
            BASE64
                .decode(text)
                .ok()
                .and_then(|bytes| bytes.try_into().ok())
                .ok_or(ScramError::BadVerifier)
        };
        Ok(Verifier {
            iterations: iterations
                .parse()
                .ok()
                .filter(|n| *n > 0)
                .ok_or(ScramError::BadVerifier)?,
            salt: BASE64.decode(salt).map_err(|_| ScramError::BadVerifier)?,
            stored_key: key(stored)?,
            server_key: key(server)?,
        })
    }
}

/// The server side of one exchange.
pub struct ServerExchange {
    verifier: Verifier,
    client_first_bare: String,
    server_first: String,
    nonce: String,
    /// The `c=` the client-final message must carry: the gs2 header, and
    /// the binding data when the client bound.
    channel_binding: String,
}

impl ServerExchange {
    /// Reads the client-first message of `mechanism` (SCRAM-SHA-256 or
    /// -PLUS); `binding` is this side's `tls-server-end-point` when the
    /// session is TLS and -PLUS was offered. Returns the exchange and the
    /// server-first message to send.
    pub fn start(
        verifier: Verifier,
        mechanism: &str,
        client_first: &[u8],
        binding: Option<&[u8]>,
    ) -> Result<(ServerExchange, String), ScramError> {
        let text = std::str::from_utf8(client_first).map_err(|_| ScramError::Malformed)?;
        let plus = mechanism == MECHANISM_PLUS;
        // gs2 header: "n,," (no binding), "y,," (the client could bind but
        // saw no -PLUS offered), "p=tls-server-end-point,," (bound).
        let (header, bare) = if let Some(bare) = text.strip_prefix("n,,") {
            ("n,,", bare)
        } else if let Some(bare) = text.strip_prefix("y,,") {
            if binding.is_some() {
                return Err(ScramError::BindingDowngrade);
            }
            ("y,,", bare)
        } else if let Some(bare) = text.strip_prefix("p=tls-server-end-point,,") {
            if !plus || binding.is_none() {
                return Err(ScramError::ChannelBinding);
            }
            ("p=tls-server-end-point,,", bare)
        } else if text.starts_with("p=") {
            return Err(ScramError::ChannelBinding);
        } else {
            return Err(ScramError::Malformed);
        };
        if plus && !header.starts_with("p=") {
            return Err(ScramError::ChannelBinding);
        }
        let mut bound = header.as_bytes().to_vec();
        if plus {
            bound.extend_from_slice(binding.unwrap_or_default());
        }
        let client_nonce = bare
            .split(',')
            .find_map(|part| part.strip_prefix("r="))
            .filter(|nonce| !nonce.is_empty())
            .ok_or(ScramError::Malformed)?;
        let mut random = [0u8; 18];
        rand::thread_rng().fill_bytes(&mut random);
        let nonce = format!("{client_nonce}{}", BASE64.encode(random));
        let server_first = format!(
            "r={nonce},s={},i={}",
            BASE64.encode(&verifier.salt),
            verifier.iterations
        );
        Ok((
            ServerExchange {
                verifier,
                client_first_bare: bare.to_owned(),
                server_first: server_first.clone(),
                nonce,
                channel_binding: BASE64.encode(bound),
            },
            server_first,
        ))
    }

    /// Checks the client-final message; returns the server-final message.
    pub fn finish(self, client_final: &[u8]) -> Result<String, ScramError> {
        let text = std::str::from_utf8(client_final).map_err(|_| ScramError::Malformed)?;
        let (without_proof, proof) = text.rsplit_once(",p=").ok_or(ScramError::Malformed)?;
        let nonce = without_proof
            .split(',')
            .find_map(|part| part.strip_prefix("r="))
            .ok_or(ScramError::Malformed)?;
        if nonce != self.nonce {
            return Err(ScramError::Nonce);
        }
        let binding = without_proof
            .split(',')
            .find_map(|part| part.strip_prefix("c="))
            .ok_or(ScramError::Malformed)?;
        if binding != self.channel_binding {
            return Err(ScramError::BindingMismatch);
        }
        let proof: [u8; 32] = BASE64
            .decode(proof)
            .ok()
            .and_then(|bytes| bytes.try_into().ok())
            .ok_or(ScramError::Malformed)?;
        let auth_message = format!(
            "{},{},{}",
            self.client_first_bare, self.server_first, without_proof
        );
        let signature = hmac(&self.verifier.stored_key, auth_message.as_bytes());
        let mut client_key = [0u8; 32];
        for i in 0..32 {
            client_key[i] = proof[i] ^ signature[i];
        }
        let stored: [u8; 32] = Sha256::digest(client_key).into();
        if !constant_time_eq(&stored, &self.verifier.stored_key) {
            return Err(ScramError::WrongProof);
        }
        let server_signature = hmac(&self.verifier.server_key, auth_message.as_bytes());
        Ok(format!("v={}", BASE64.encode(server_signature)))
    }
}

/// How the client side binds the exchange to its TLS session.
pub enum ClientBinding {
    /// Not on TLS, or binding is not possible ("n").
    None,
    /// On TLS, but the server offered no -PLUS ("y").
    Possible,
    /// SCRAM-SHA-256-PLUS with the server's `tls-server-end-point` ("p").
    Bound(Vec<u8>),
}

/// The client side of one exchange (the coordinator logging in to a server).
pub struct ClientExchange {
    password: String,
    nonce: String,
    client_first_bare: String,
    /// The `c=` of client-final: base64 of the gs2 header and binding data.
    channel_binding: String,
    expected_server_signature: Option<[u8; 32]>,
}

impl ClientExchange {
    /// Returns the exchange, the mechanism to name and the client-first
    /// message.
    pub fn start(password: &str, binding: ClientBinding) -> (ClientExchange, &'static str, String) {
        let mut random = [0u8; 18];
        rand::thread_rng().fill_bytes(&mut random);
        let nonce = BASE64.encode(random);
        let client_first_bare = format!("n=,r={nonce}");
        let (mechanism, header, data) = match binding {
            ClientBinding::None => (MECHANISM, "n,,", Vec::new()),
            ClientBinding::Possible => (MECHANISM, "y,,", Vec::new()),
            ClientBinding::Bound(data) => (MECHANISM_PLUS, "p=tls-server-end-point,,", data),
        };
        let mut bound = header.as_bytes().to_vec();
        bound.extend_from_slice(&data);
        (
            ClientExchange {
                password: password.to_owned(),
                nonce,
                client_first_bare: client_first_bare.clone(),
                channel_binding: BASE64.encode(bound),
                expected_server_signature: None,
            },
            mechanism,
            format!("{header}{client_first_bare}"),
        )
    }

    /// Reads server-first; returns client-final.
    pub fn respond(&mut self, server_first: &[u8]) -> Result<String, ScramError> {
        let text = std::str::from_utf8(server_first).map_err(|_| ScramError::Malformed)?;
        let field = |name: &str| {
            text.split(',')
                .find_map(|part| part.strip_prefix(name))
                .ok_or(ScramError::Malformed)
        };
        let nonce = field("r=")?;
        if !nonce.starts_with(&self.nonce) {
            return Err(ScramError::Nonce);
        }
        let salt = BASE64
            .decode(field("s=")?)
            .map_err(|_| ScramError::Malformed)?;
        let iterations: u32 = field("i=")?.parse().map_err(|_| ScramError::Malformed)?;
        if iterations == 0 {
            return Err(ScramError::Malformed);
        }
        let salted = salted_password(self.password.as_bytes(), &salt, iterations);
        let client_key = hmac(&salted, b"Client Key");
        let stored_key: [u8; 32] = Sha256::digest(client_key).into();
        let without_proof = format!("c={},r={nonce}", self.channel_binding);
        let auth_message = format!("{},{},{}", self.client_first_bare, text, without_proof);
        let signature = hmac(&stored_key, auth_message.as_bytes());
        let mut proof = [0u8; 32];
        for i in 0..32 {
            proof[i] = client_key[i] ^ signature[i];
        }
        let server_key = hmac(&salted, b"Server Key");
        self.expected_server_signature = Some(hmac(&server_key, auth_message.as_bytes()));
        Ok(format!("{without_proof},p={}", BASE64.encode(proof)))
    }

    /// Checks server-final.
    pub fn verify(&self, server_final: &[u8]) -> Result<(), ScramError> {
        let text = std::str::from_utf8(server_final).map_err(|_| ScramError::Malformed)?;
        let signature = text.strip_prefix("v=").ok_or(ScramError::Malformed)?;
        let signature = BASE64
            .decode(signature)
            .map_err(|_| ScramError::Malformed)?;
        match self.expected_server_signature {
            Some(expected) if constant_time_eq(&signature, &expected) => Ok(()),
            _ => Err(ScramError::ServerSignature),
        }
    }
}

/// PostgreSQL's md5 password response: "md5" || md5(md5(password || user) || salt).
pub fn md5_response(user: &str, password: &str, salt: &[u8]) -> String {
    let inner = format!("{:x}", md5_digest(format!("{password}{user}").as_bytes()));
    let mut outer = inner.into_bytes();
    outer.extend_from_slice(salt);
    format!("md5{:x}", md5_digest(&outer))
}

fn md5_digest(bytes: &[u8]) -> md5::Digest {
    md5::compute(bytes)
}

fn salted_password(password: &[u8], salt: &[u8], iterations: u32) -> [u8; 32] {
    // Hi() of RFC 5802: PBKDF2 with HMAC-SHA-256 and one output block.
    let mut block = salt.to_vec();
    block.extend_from_slice(&1u32.to_be_bytes());
    let mut u = hmac(password, &block);
    let mut result = u;
    for _ in 1..iterations {
        u = hmac(password, &u);
        for (r, x) in result.iter_mut().zip(u.iter()) {
            *r ^= x;
        }
    }
    result
}

fn hmac(key: &[u8], message: &[u8]) -> [u8; 32] {
    // HMAC accepts keys of any length.
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(message);
    mac.finalize().into_bytes().into()
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One whole exchange; the server's error if it refuses.
    fn exchange(
        password: &str,
        client_binding: ClientBinding,
        server_binding: Option<&[u8]>,
    ) -> Result<(), ScramError> {
        let verifier = Verifier::from_password("s3cret");
        let (mut client, mechanism, first) = ClientExchange::start(password, client_binding);
        let (server, server_first) =
            ServerExchange::start(verifier, mechanism, first.as_bytes(), server_binding)?;
        let client_final = client.respond(server_first.as_bytes())?;
        let server_final = server.finish(client_final.as_bytes())?;
        client.verify(server_final.as_bytes())
    }

    #[test]
    fn client_and_server_agree() {
        assert_eq!(exchange("s3cret", ClientBinding::None, None), Ok(()));
        assert_eq!(exchange("s3cret", ClientBinding::Possible, None), Ok(()));
        assert_eq!(
            exchange("s3cret", ClientBinding::None, Some(b"cert")),
            Ok(())
        );
        assert_eq!(
            exchange(
                "s3cret",
                ClientBinding::Bound(b"cert".to_vec()),
                Some(b"cert")
            ),
            Ok(())
        );
    }

    #[test]
    fn wrong_password_is_refused() {
        assert_eq!(
            exchange("guess", ClientBinding::None, None),
            Err(ScramError::WrongProof)
        );
        assert_eq!(
            exchange(
                "guess",
                ClientBinding::Bound(b"cert".to_vec()),
                Some(b"cert")
            ),
            Err(ScramError::WrongProof)
        );
    }

    #[test]
    fn binding_to_another_session_is_refused() {
        // A man in the middle: the client's session has another certificate.
        assert_eq!(
            exchange(
                "s3cret",
                ClientBinding::Bound(b"other".to_vec()),
                Some(b"cert")
            ),
            Err(ScramError::BindingMismatch)
        );
        // A client that could bind, told (falsely) that the server cannot.
        assert_eq!(
            exchange("s3cret", ClientBinding::Possible, Some(b"cert")),
            Err(ScramError::BindingDowngrade)
        );
        // Binding where the server has nothing to bind to.
        assert_eq!(
            exchange("s3cret", ClientBinding::Bound(b"cert".to_vec()), None),
            Err(ScramError::ChannelBinding)
        );
    }

    #[test]
    fn postgres_verifier_parses() {
        // Produced by PostgreSQL 15 for the password "pencil".
        let text = "SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==$WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:ZJTRrKuy8V5oeKxNXKtQLbi94mn9qv3pqmKkZ1F5rAs=";
        let verifier = Verifier::parse(text).unwrap();
        assert_eq!(verifier.iterations, 4096);
        assert!(Verifier::parse("md5abc").is_err());
        assert!(Verifier::parse("SCRAM-SHA-256$0:AA==$AA==:AA==").is_err());
    }

    #[test]
    fn channel_binding_and_garbage_are_refused() {
        let verifier = Verifier::from_password("x");
        assert_eq!(
            ServerExchange::start(
                verifier.clone(),
                MECHANISM,
                b"p=tls-server-end-point,,n=,r=abc",
                None
            )
            .err(),
            Some(ScramError::ChannelBinding)
        );
        // -PLUS named, but no binding in the message
        assert_eq!(
            ServerExchange::start(verifier.clone(), MECHANISM_PLUS, b"n,,n=,r=abc", Some(b"c"))
                .err(),
            Some(ScramError::ChannelBinding)
        );
        assert!(ServerExchange::start(verifier, MECHANISM, b"\xff", None).is_err());
    }

    #[test]
    fn md5_matches_postgres() {
        // SELECT 'md5' || md5(md5('pw' || 'alice') || 'salt')
        assert_eq!(
            md5_response("alice", "pw", b"salt"),
            "md5acdd2c0b936b54dbae7d1b09619fda57"
        );
    }
}
