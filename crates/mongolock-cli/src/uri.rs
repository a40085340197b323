//! Connection strings in messages: the password is always masked.

/// The mask shown in place of a password.
const MASK: &str = "****";

/// `uri` with the password (if any) replaced by `****`:
/// `mongodb://app:s3cret@db1:27017/?tls=true` → `mongodb://app:****@db1:27017/?tls=true`.
///
/// Works on text that is not a valid URI too (it is used to report bad URIs): the user info is
/// everything before the last `@` that precedes the query string. Masking errs on the side of
/// hiding too much.
pub fn mask_password(uri: &str) -> String {
    let Some((scheme, rest)) = uri.split_once("://") else {
        // Not a URI at all; if it looks like `user:pass@host` anyway, mask it.
        return mask_userinfo("", uri);
    };
    mask_userinfo(&format!("{scheme}://"), rest)
}

fn mask_userinfo(prefix: &str, rest: &str) -> String {
    let before_query = rest.find('?').map_or(rest, |q| &rest[..q]);
    let Some(at) = before_query.rfind('@') else {
        return format!("{prefix}{rest}");
    };
    let userinfo = &rest[..at];
    match userinfo.find(':') {
        Some(colon) => format!("{prefix}{}:{MASK}{}", &userinfo[..colon], &rest[at..]),
        None => format!("{prefix}{rest}"),
    }
}

/// The password in `uri`, percent-decoded, if there is one.
pub fn password(uri: &str) -> Option<String> {
    let rest = uri.split_once("://").map_or(uri, |(_, r)| r);
    let before_query = rest.find('?').map_or(rest, |q| &rest[..q]);
    let at = before_query.rfind('@')?;
    let (_, pass) = rest[..at].split_once(':')?;
    if pass.is_empty() {
        return None;
    }
    Some(
        percent_encoding::percent_decode_str(pass)
            .decode_utf8_lossy()
            .into_owned(),
    )
}

/// Removes any occurrence of the URI's password from `message` (driver messages do not normally
/// contain it; this is a second line of defence). Passwords shorter than 4 characters are not
/// searched for, as they would match ordinary text.
pub fn redact(message: &str, uri: &str) -> String {
    let mut out = message.to_owned();
    if let Some(pass) = password(uri) {
        if pass.chars().count() >= 4 {
            out = out.replace(&pass, MASK);
        }
        let raw = uri
            .split_once("://")
            .map_or(uri, |(_, r)| r)
            .split('@')
            .next()
            .and_then(|ui| ui.split_once(':'))
            .map(|(_, p)| p.to_owned());
        if let Some(raw) = raw {
            if raw.chars().count() >= 4 {
                out = out.replace(&raw, MASK);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_passwords() {
        assert_eq!(
            mask_password("mongodb://app:s3cret@db1:27017,db2/?replicaSet=rs0"),
            "mongodb://app:****@db1:27017,db2/?replicaSet=rs0"
        );
        assert_eq!(
            mask_password("mongodb+srv://app:p%40ss@cluster0.example.net/app"),
            "mongodb+srv://app:****@cluster0.example.net/app"
        );
        // An unencoded '@' in the password: everything up to the last '@' is hidden.
        assert_eq!(
            mask_password("mongodb://app:p@ss@db1"),
            "mongodb://app:****@db1"
        );
        assert_eq!(
            mask_password("mongodb://db1:27017/?appName=a@b"),
            "mongodb://db1:27017/?appName=a@b"
        );
        assert_eq!(mask_password("mongodb://app@db1"), "mongodb://app@db1");
        assert_eq!(mask_password("mongodb://localhost"), "mongodb://localhost");
        assert_eq!(mask_password("app:secret@db1"), "app:****@db1");
        assert_eq!(mask_password("not a uri"), "not a uri");
    }

    #[test]
    fn redacts_passwords_from_messages() {
        let uri = "mongodb://app:p%40ssword@db1";
        assert_eq!(password(uri).as_deref(), Some("p@ssword"));
        assert_eq!(
            redact("auth failed for p@ssword and p%40ssword", uri),
            "auth failed for **** and ****"
        );
        assert_eq!(redact("anything", "mongodb://db1"), "anything");
        // Escapes at the very end, and sequences that are not escapes.
        assert_eq!(
            password("postgres://u:a%2Fb%40@h/db").as_deref(),
            Some("a/b@")
        );
        assert_eq!(password("mongodb://u:p%zz%4@h").as_deref(), Some("p%zz%4"));
        assert_eq!(password("mongodb://u:@h"), None);
    }
}
