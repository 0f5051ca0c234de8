//! Kubernetes name rules, applied to site names, group names, instances and namespaces.
//!
//! The rules are the ones the Kubernetes API server applies (`IsDNS1123Label`,
//! `IsDNS1123Subdomain`), so a name accepted here is accepted by a real cluster and the other way
//! round. Each check returns the rule it broke as a sentence, ready to be put after a field name.

/// Formats 16 random bytes as a version-4 UUID (`xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx`), the
/// shape of object uids and operation IDs. The caller draws the randomness.
pub fn uuid_v4(mut random: [u8; 16]) -> String {
    random[6] = (random[6] & 0x0f) | 0x40;
    random[8] = (random[8] & 0x3f) | 0x80;
    let h = hex::encode(random);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Checks a DNS-1123 label: 1–63 characters, lowercase alphanumerics or `-`, starting and
/// ending with an alphanumeric.
pub fn check_dns1123_label(s: &str) -> Result<(), &'static str> {
    if s.is_empty() {
        return Err("must not be empty");
    }
    if s.len() > 63 {
        return Err("must be at most 63 characters (DNS-1123 label)");
    }
    check_label_chars(s)
}

/// Checks a DNS-1123 subdomain: 1–253 characters, dot-separated DNS-1123 labels.
pub fn check_dns1123_subdomain(s: &str) -> Result<(), &'static str> {
    if s.is_empty() {
        return Err("must not be empty");
    }
    if s.len() > 253 {
        return Err("must be at most 253 characters (DNS-1123 subdomain)");
    }
    for label in s.split('.') {
        if label.is_empty() {
            return Err("must not contain empty dot-separated parts (DNS-1123 subdomain)");
        }
        check_label_chars(label)?;
    }
    Ok(())
}

fn check_label_chars(s: &str) -> Result<(), &'static str> {
    let ok_char = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-';
    if !s.bytes().all(ok_char) {
        return Err("must consist of lowercase letters, digits and '-' (DNS-1123)");
    }
    let bytes = s.as_bytes();
    if bytes.first() == Some(&b'-') || bytes.last() == Some(&b'-') {
        return Err("must start and end with a letter or digit (DNS-1123)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        for ok in ["iad", "pdx-2", "a", "0abc", &"a".repeat(63)] {
            assert_eq!(check_dns1123_label(ok), Ok(()), "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a.b", "a_b", "é", &"a".repeat(64)] {
            assert!(check_dns1123_label(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn subdomains() {
        for ok in ["counter-app", "a.b.c", "x1.y-2"] {
            assert_eq!(check_dns1123_subdomain(ok), Ok(()), "{ok}");
        }
        for bad in ["", ".a", "a.", "a..b", "A.b", "a b", &"a".repeat(254)] {
            assert!(check_dns1123_subdomain(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn uuid_v4_sets_version_and_variant_bits() {
        assert_eq!(uuid_v4([0; 16]), "00000000-0000-4000-8000-000000000000");
        assert_eq!(uuid_v4([0xff; 16]), "ffffffff-ffff-4fff-bfff-ffffffffffff");
    }
}
