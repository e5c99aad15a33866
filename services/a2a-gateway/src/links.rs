//! The file links the A2A gateway hands its clients (docs/a2a.md "Files"): `GET
//! <public_url>/files/<file>.<agent>.<expires>.<signature>`, an HMAC-SHA256 over the file, the
//! client agent that may read it by the link, and when the link runs out, keyed by the secret
//! every replica shares (so any replica serves what another signed). `serve::files` serves
//! them; `mapping` puts them in tasks and answers.

use std::time::Duration;

use ring::hmac;
use switchboard_proto::AgentId;
use switchboard_proto::files::Attachment;
use uuid::Uuid;

/// What a link's signature covers before its fields: a key made for other uses never makes
/// a valid link.
const LINK_DOMAIN: &str = "switchboard-a2a-file-link:v1";
/// The agents a link may name: the gateway's clients (`a2a-<name>`).
const CLIENT_PREFIX: &str = "a2a-";

/// Signs and checks the gateway's file links.
pub struct FileLinks {
    key: hmac::Key,
    base: String,
    ttl: Duration,
}

impl std::fmt::Debug for FileLinks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileLinks")
            .field("base", &self.base)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

/// Why a link is refused (each a 404: a link that is not one and one that ran out look
/// alike).
#[derive(Debug, PartialEq, Eq)]
pub enum LinkRefusal {
    /// Not `<file>.<agent>.<expires>.<signature>`, or a field that does not parse.
    Malformed,
    /// Signed by another key, or changed.
    BadSignature,
    /// Past its time.
    Expired,
}

impl FileLinks {
    /// Links under `base` (the gateway's public URL), signed with `secret` (shared by every
    /// replica), each good for `ttl`.
    pub fn new(secret: &str, base: String, ttl: Duration) -> Self {
        Self {
            key: hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes()),
            base,
            ttl,
        }
    }

    fn signed(&self, file: &Uuid, reader: &AgentId, expires: u64) -> hmac::Tag {
        hmac::sign(
            &self.key,
            format!("{LINK_DOMAIN}\n{file}\n{reader}\n{expires}").as_bytes(),
        )
    }

    /// The link `reader` reads `file` by, good from `now` (Unix seconds) for the links' TTL.
    pub fn url(&self, reader: &AgentId, file: &Uuid, now: u64) -> String {
        use base64::Engine as _;
        let expires = now.saturating_add(self.ttl.as_secs());
        let signature = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(self.signed(file, reader, expires).as_ref());
        format!("{}/files/{file}.{reader}.{expires}.{signature}", self.base)
    }

    /// An attachment as the A2A `url` part `reader` gets: the link, the name, the media type.
    pub fn part(&self, reader: &AgentId, attachment: &Attachment) -> a2a::Part {
        let mut part = a2a::Part::url(self.url(reader, &attachment.file_ref, unix_now()));
        part.filename = Some(attachment.name.clone());
        part.media_type = Some(attachment.media_type.clone());
        part
    }

    /// The parts of `attachments` for `reader`.
    pub fn parts(&self, reader: &AgentId, attachments: &[Attachment]) -> Vec<a2a::Part> {
        attachments
            .iter()
            .map(|attachment| self.part(reader, attachment))
            .collect()
    }

    /// Who may read which file by `token` (the link's last path segment), at `now`.
    pub fn check(&self, token: &str, now: u64) -> Result<(AgentId, Uuid), LinkRefusal> {
        use base64::Engine as _;
        let mut fields = token.split('.');
        let (Some(file), Some(reader), Some(expires), Some(signature), None) = (
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
        ) else {
            return Err(LinkRefusal::Malformed);
        };
        let file = Uuid::parse_str(file).map_err(|_| LinkRefusal::Malformed)?;
        // Links are only made for the gateway's clients: a reader that is not one (a key that
        // leaked still reads no other agent's files over HTTP).
        let reader = AgentId::parse(reader)
            .ok()
            .filter(|reader| reader.as_str().starts_with(CLIENT_PREFIX))
            .ok_or(LinkRefusal::Malformed)?;
        let expires: u64 = expires.parse().map_err(|_| LinkRefusal::Malformed)?;
        let signature = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(signature)
            .map_err(|_| LinkRefusal::Malformed)?;
        hmac::verify(
            &self.key,
            format!("{LINK_DOMAIN}\n{file}\n{reader}\n{expires}").as_bytes(),
            &signature,
        )
        .map_err(|_| LinkRefusal::BadSignature)?;
        if expires < now {
            return Err(LinkRefusal::Expired);
        }
        Ok((reader, file))
    }
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn links(ttl: u64) -> FileLinks {
        FileLinks::new(
            "a secret of the tests",
            "http://127.0.0.1:9".into(),
            Duration::from_secs(ttl),
        )
    }

    fn token(url: &str) -> &str {
        url.rsplit('/').next().unwrap()
    }

    #[test]
    fn a_link_names_its_reader_and_file_and_runs_out() {
        let links = links(60);
        let reader = AgentId::parse("a2a-alice").unwrap();
        let file = switchboard_proto::new_id();
        let url = links.url(&reader, &file, 1_000);
        assert!(url.starts_with("http://127.0.0.1:9/files/"), "{url}");
        assert_eq!(links.check(token(&url), 1_000), Ok((reader.clone(), file)));
        assert_eq!(links.check(token(&url), 1_060), Ok((reader, file)));
        assert_eq!(links.check(token(&url), 1_061), Err(LinkRefusal::Expired));
    }

    #[test]
    fn a_changed_or_foreign_link_is_refused() {
        let links = links(60);
        let reader = AgentId::parse("a2a-alice").unwrap();
        let file = switchboard_proto::new_id();
        let url = links.url(&reader, &file, 1_000);
        let good = token(&url);
        let fields: Vec<&str> = good.split('.').collect();
        // Another reader, another file, a later expiry: each breaks the signature.
        for forged in [
            format!("{}.a2a-mallory.{}.{}", fields[0], fields[2], fields[3]),
            format!(
                "{}.{}.{}.{}",
                switchboard_proto::new_id(),
                fields[1],
                fields[2],
                fields[3]
            ),
            format!("{}.{}.9999999999.{}", fields[0], fields[1], fields[3]),
        ] {
            assert_eq!(links.check(&forged, 1_000), Err(LinkRefusal::BadSignature));
        }
        let other = FileLinks::new("another key", "http://x".into(), Duration::from_secs(60));
        assert_eq!(other.check(good, 1_000), Err(LinkRefusal::BadSignature));
        // A link for an agent that is no client of the gateway is no link, signed or not.
        let writer = AgentId::parse("writer").unwrap();
        let url = links.url(&writer, &file, 1_000);
        assert_eq!(links.check(token(&url), 1_000), Err(LinkRefusal::Malformed));
        for bad in [
            "",
            "a.b.c",
            "a.b.c.d.e",
            &format!("{good}."),
            "x.a2a-a.1.AAAA",
        ] {
            assert_eq!(
                links.check(bad, 1_000),
                Err(LinkRefusal::Malformed),
                "{bad}"
            );
        }
    }
}
