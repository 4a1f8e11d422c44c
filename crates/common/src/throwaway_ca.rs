//! A throw-away certificate authority for `dualera up --tls`, the tests and the
//! benchmark. It is the one user of rcgen, which only builds with the `tls` feature
//! (re-exported as `tls::ThrowawayCa`).

/// A throw-away certificate authority (rcgen), for `dualera up --tls`, the tests and
/// the benchmark: it issues leaf certificates for loopback names. Its key lives only
/// in memory.
#[derive(Debug)]
pub struct ThrowawayCa {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    pem: String,
}

/// How long an issued certificate is valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Validity {
    /// Valid now (rcgen's default window, 1975 to 4096).
    Current,
    /// Expired years ago (for refusal tests).
    Expired,
}

impl ThrowawayCa {
    /// A new CA named `name`.
    pub fn new(name: &str) -> Result<Self, rcgen::Error> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let key = rcgen::KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        Ok(Self {
            pem: cert.pem(),
            issuer: rcgen::Issuer::new(params, key),
        })
    }

    /// The CA certificate, PEM (what a host or `--upstream-ca` is given).
    pub fn cert_pem(&self) -> &str {
        &self.pem
    }

    /// A leaf certificate for `names` (DNS names or IP addresses): `(chain PEM, key PEM)`.
    pub fn issue(
        &self,
        names: &[&str],
        validity: Validity,
    ) -> Result<(String, String), rcgen::Error> {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = rcgen::CertificateParams::new(names.clone())?;
        if let Some(first) = names.first() {
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, first.as_str());
        }
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        if validity == Validity::Expired {
            params.not_before = rcgen::date_time_ymd(2001, 1, 1);
            params.not_after = rcgen::date_time_ymd(2002, 1, 1);
        }
        let key = rcgen::KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}
