//! SCRAM channel binding's `tls-server-end-point` (RFC 5929): the hash of
//! the server's certificate, with the hash function of the certificate's
//! signature (SHA-256 for MD5 and SHA-1), as PostgreSQL computes it. The
//! certificate's DER is read only as far as its signature algorithm.

use sha2::{Digest, Sha256, Sha384, Sha512};

/// The binding data of a DER certificate; None when its signature's hash
/// is not one PostgreSQL binds with (RSASSA-PSS, Ed25519, SHA-224).
pub fn tls_server_end_point(certificate: &[u8]) -> Option<Vec<u8>> {
    let (certificate_body, _) = der_element(certificate, 0x30)?;
    let (_, after_tbs) = der_element(certificate_body, 0x30)?;
    let (algorithm, _) = der_element(after_tbs, 0x30)?;
    let (oid, _) = der_element(algorithm, 0x06)?;
    const RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01];
    const ECDSA: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04];
    let hash = match oid {
        // md5WithRSA, sha1WithRSA; ecdsa-with-SHA1: SHA-256, as RFC 5929 says
        [rsa @ .., 0x04 | 0x05] if rsa == RSA => Hash::Sha256,
        [ecdsa @ .., 0x01] if ecdsa == ECDSA => Hash::Sha256,
        [rsa @ .., 0x0b] if rsa == RSA => Hash::Sha256,
        [rsa @ .., 0x0c] if rsa == RSA => Hash::Sha384,
        [rsa @ .., 0x0d] if rsa == RSA => Hash::Sha512,
        [ecdsa @ .., 0x03, 0x02] if ecdsa == ECDSA => Hash::Sha256,
        [ecdsa @ .., 0x03, 0x03] if ecdsa == ECDSA => Hash::Sha384,
        [ecdsa @ .., 0x03, 0x04] if ecdsa == ECDSA => Hash::Sha512,
        _ => return None,
    };
    Some(match hash {
        Hash::Sha256 => Sha256::digest(certificate).to_vec(),
        Hash::Sha384 => Sha384::digest(certificate).to_vec(),
        Hash::Sha512 => Sha512::digest(certificate).to_vec(),
    })
}

enum Hash {
    Sha256,
    Sha384,
    Sha512,
}

/// The content of the DER element at the start of `der` when its tag is
/// `tag`, and what follows the element.
fn der_element(der: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (&found, rest) = der.split_first()?;
    if found != tag {
        return None;
    }
    let (&first, mut rest) = rest.split_first()?;
    let length = if first < 0x80 {
        usize::from(first)
    } else {
        let octets = usize::from(first & 0x7f);
        if octets == 0 || octets > 4 || rest.len() < octets {
            return None;
        }
        let (length, after) = rest.split_at(octets);
        rest = after;
        length
            .iter()
            .fold(0usize, |n, b| (n << 8) | usize::from(*b))
    };
    if rest.len() < length {
        return None;
    }
    Some(rest.split_at(length))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A certificate's outline: SEQUENCE { tbs SEQUENCE, algorithm
    /// SEQUENCE { OID }, signature BIT STRING }.
    fn certificate(oid: &[u8]) -> Vec<u8> {
        let mut algorithm = vec![0x06, oid.len() as u8];
        algorithm.extend_from_slice(oid);
        let mut body = vec![0x30, 0x03, 0x02, 0x01, 0x01];
        body.push(0x30);
        body.push(algorithm.len() as u8);
        body.extend_from_slice(&algorithm);
        body.extend_from_slice(&[0x03, 0x02, 0x00, 0xff]);
        let mut der = vec![0x30, 0x81, body.len() as u8];
        der.extend_from_slice(&body);
        der
    }

    #[test]
    fn hash_follows_the_signature() {
        let sha256_rsa = certificate(&[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0b]);
        assert_eq!(
            tls_server_end_point(&sha256_rsa),
            Some(Sha256::digest(&sha256_rsa).to_vec())
        );
        let sha384_ecdsa = certificate(&[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x03]);
        assert_eq!(
            tls_server_end_point(&sha384_ecdsa),
            Some(Sha384::digest(&sha384_ecdsa).to_vec())
        );
        let sha1_rsa = certificate(&[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x05]);
        assert_eq!(
            tls_server_end_point(&sha1_rsa),
            Some(Sha256::digest(&sha1_rsa).to_vec())
        );
    }

    #[test]
    fn unknown_signatures_and_garbage_bind_nothing() {
        let ed25519 = certificate(&[0x2b, 0x65, 0x70]);
        assert_eq!(tls_server_end_point(&ed25519), None);
        assert_eq!(tls_server_end_point(b"not a certificate"), None);
        assert_eq!(tls_server_end_point(&[0x30, 0x84, 0xff, 0xff]), None);
    }
}
