//! SCRAM-SHA-256 (RFC 5802 / 7677) as PostgreSQL uses it: the server side
//! for clients, the client side for servers that ask the coordinator for a
//! password. No channel binding (SCRAM-SHA-256-PLUS), even over TLS:
//! clients with channel_binding=require cannot log in.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::{Digest, Sha256};
use thiserror::Error;

type HmacSha256 = Hmac<Sha256>;

pub const MECHANISM: &str = "SCRAM-SHA-256";
const DEFAULT_ITERATIONS: u32 = 4096;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ScramError {
    #[error("malformed SCRAM message")]
    Malformed,
    #[error("channel binding is not supported")]
    ChannelBinding,
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
}

impl ServerExchange {
    /// Reads the client-first message; returns the exchange and the
    /// server-first message to send.
    pub fn start(
        verifier: Verifier,
        client_first: &[u8],
    ) -> Result<(ServerExchange, String), ScramError> {
        let text = std::str::from_utf8(client_first).map_err(|_| ScramError::Malformed)?;
        // gs2 header: "n,," (no binding) or "y,," (client could but we can't).
        let bare = if let Some(bare) = text.strip_prefix("n,,") {
            bare
        } else if let Some(bare) = text.strip_prefix("y,,") {
            bare
        } else if text.starts_with("p=") {
            return Err(ScramError::ChannelBinding);
        } else {
            return Err(ScramError::Malformed);
        };
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

/// The client side of one exchange (the coordinator logging in to a server).
pub struct ClientExchange {
    password: String,
    nonce: String,
    client_first_bare: String,
    expected_server_signature: Option<[u8; 32]>,
}

impl ClientExchange {
    /// Returns the exchange and the client-first message.
    pub fn start(password: &str) -> (ClientExchange, String) {
        let mut random = [0u8; 18];
        rand::thread_rng().fill_bytes(&mut random);
        let nonce = BASE64.encode(random);
        let client_first_bare = format!("n=,r={nonce}");
        (
            ClientExchange {
                password: password.to_owned(),
                nonce,
                client_first_bare: client_first_bare.clone(),
                expected_server_signature: None,
            },
            format!("n,,{client_first_bare}"),
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
        let without_proof = format!("c=biws,r={nonce}");
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

    #[test]
    fn client_and_server_agree() {
        let verifier = Verifier::from_password("s3cret");
        let (mut client, first) = ClientExchange::start("s3cret");
        let (server, server_first) = ServerExchange::start(verifier, first.as_bytes()).unwrap();
        let client_final = client.respond(server_first.as_bytes()).unwrap();
        let server_final = server.finish(client_final.as_bytes()).unwrap();
        client.verify(server_final.as_bytes()).unwrap();
    }

    #[test]
    fn wrong_password_is_refused() {
        let verifier = Verifier::from_password("s3cret");
        let (mut client, first) = ClientExchange::start("guess");
        let (server, server_first) = ServerExchange::start(verifier, first.as_bytes()).unwrap();
        let client_final = client.respond(server_first.as_bytes()).unwrap();
        assert_eq!(
            server.finish(client_final.as_bytes()),
            Err(ScramError::WrongProof)
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
            ServerExchange::start(verifier.clone(), b"p=tls-server-end-point,,n=,r=abc").err(),
            Some(ScramError::ChannelBinding)
        );
        assert!(ServerExchange::start(verifier, b"\xff").is_err());
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
