//! Where a webhook may point (docs/a2a.md, "Push notifications"): a URL is where the gateway
//! writes, so it is checked like any caller-chosen target — `http` or `https`, no credentials
//! in it, and (unless the operator allows private targets) no address that is loopback,
//! private, link-local, shared or otherwise internal, in whatever form it is written: every
//! IPv6 form that carries an IPv4 host is checked as that host. The check returns the address
//! it looked at, and the POST connects there (no second lookup to rebind).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::error::GatewayError;

/// Whether the gateway may POST to `url`: `http` or `https`, and (unless private targets are
/// allowed) every address the host resolves to is a public one. Returns the host and the address to
/// connect to, so the POST goes where the check looked (no second lookup to rebind).
pub(crate) async fn allowed_target(url: &str, allow_private: bool) -> Result<Target, GatewayError> {
    let bad = |why: &str| GatewayError::InvalidParams(format!("webhook URL refused: {why}"));
    // The URL parser silently drops tabs and line breaks; a URL that holds any control or
    // space character is refused instead, so what is stored, logged and posted to is the
    // text the client sent.
    if url.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(bad("control characters or spaces in the URL"));
    }
    let parsed = reqwest::Url::parse(url).map_err(|_| bad("not a URL"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(bad("only http and https"));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(bad("no credentials in the URL; use authentication"));
    }
    let host = parsed.host_str().ok_or_else(|| bad("no host"))?;
    let port = parsed.port_or_known_default().unwrap_or(443);
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let addresses: Vec<SocketAddr> = match bare.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => tokio::time::timeout(
            Duration::from_secs(5),
            tokio::net::lookup_host((bare, port)),
        )
        .await
        .map_err(|_| {
            GatewayError::unavailable("resolving the webhook's host", "no answer within 5 s")
        })?
        .map_err(|err| GatewayError::unavailable("resolving the webhook's host", err))?
        .collect(),
    };
    let Some(first) = addresses.first().copied() else {
        return Err(bad("the host has no address"));
    };
    if !allow_private && addresses.iter().any(|address| internal(address.ip())) {
        return Err(bad("it points at an internal address"));
    }
    Ok(Target {
        host: bare.to_owned(),
        address: first,
    })
}

/// Where a webhook POST goes: its host (for the request) and the checked address.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    /// The URL's host, as the request names it.
    pub(crate) host: String,
    /// The address checked, which the POST connects to.
    pub(crate) address: SocketAddr,
}

/// Loopback, private, link-local, shared, documentation, multicast or unspecified: an address
/// a webhook must not point at.
fn internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                || a == 0
                || (a == 100 && (64..128).contains(&b))
        }
        IpAddr::V6(v6) => {
            let segments = v6.segments();
            let first = segments[0];
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                // Unique local fc00::/7, link-local fe80::/10, the old site-local fec0::/10.
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80
                || (first & 0xffc0) == 0xfec0
                // Documentation 2001:db8::/32, Teredo 2001::/32 (a tunnel to anywhere),
                // discard-only 100::/64.
                || (first == 0x2001 && matches!(segments[1], 0 | 0x0db8))
                || segments[..4] == [0x100, 0, 0, 0]
                || embedded_v4(&v6).is_some_and(|v4| internal(IpAddr::V4(v4)))
        }
    }
}

/// The IPv4 address an IPv6 address carries, in every form a resolver or a URL may give:
/// compatible `::a.b.c.d`, mapped `::ffff:a.b.c.d`, translated `::ffff:0:a.b.c.d`, NAT64
/// `64:ff9b::a.b.c.d` and `64:ff9b:1::/48`, and 6to4 `2002:aabb:ccdd::/48`. Each reaches the
/// IPv4 host, so each is checked as that host.
fn embedded_v4(v6: &std::net::Ipv6Addr) -> Option<std::net::Ipv4Addr> {
    let s = v6.segments();
    let tail = |hi: u16, lo: u16| {
        let [a, b] = hi.to_be_bytes();
        let [c, d] = lo.to_be_bytes();
        std::net::Ipv4Addr::new(a, b, c, d)
    };
    match s {
        [0, 0, 0, 0, 0, 0 | 0xffff, hi, lo] => Some(tail(hi, lo)),
        [0, 0, 0, 0, 0xffff, 0, hi, lo] => Some(tail(hi, lo)),
        [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] => Some(tail(hi, lo)),
        [0x64, 0xff9b, 1, ..] => Some(tail(s[6], s[7])),
        [0x2002, hi, lo, ..] => Some(tail(hi, lo)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_addresses_are_recognised() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "::1",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            // Issue 26: the IPv4 host inside other IPv6 forms.
            "::127.0.0.1",
            "::ffff:0:127.0.0.1",
            "64:ff9b::127.0.0.1",
            "64:ff9b::10.0.0.1",
            "64:ff9b:1::a00:1",
            "2002:7f00:1::1",
            "2002:a9fe:a9fe::1",
            "2001:db8::1",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "fec0::1",
            "100::1",
        ] {
            let ip: IpAddr = ip.parse().unwrap_or(IpAddr::from([127, 0, 0, 1]));
            assert!(internal(ip), "{ip}");
        }
        for ip in [
            "93.184.216.34",
            "2606:4700::1111",
            "64:ff9b::5db8:d822",
            "2002:5db8:d822::1",
        ] {
            let ip: IpAddr = ip.parse().unwrap_or(IpAddr::from([127, 0, 0, 1]));
            assert!(!internal(ip), "{ip}");
        }
    }

    #[tokio::test]
    async fn webhook_targets_are_checked() {
        for (url, private_ok) in [
            ("ftp://example.com/x", true),
            ("http://user:pw@example.com/", true),
            ("not a url", true),
            ("http://127.0.0.1:9/hook", false),
            ("http://[::1]:9/hook", false),
            ("http://169.254.169.254/latest/meta-data", false),
            // Issue 26: loopback written as other IPv6 forms.
            ("http://[::127.0.0.1]:9/hook", false),
            ("http://[::ffff:0:127.0.0.1]:9/hook", false),
            ("http://[64:ff9b::127.0.0.1]:9/hook", false),
            // Issue 37: line breaks the URL parser would drop, to forge a log line.
            (
                "http://127.0.0.1:9/hook\n2026-01-01T00:00:00Z ERROR audit: forged",
                true,
            ),
            ("http://127.0.0.1:9/ho\r\nok", true),
            ("http://127.0.0.1:9/\u{1b}[2J", true),
            ("http://127.0.0.1:9/a b", true),
        ] {
            assert!(allowed_target(url, private_ok).await.is_err(), "{url}");
        }
        assert!(
            allowed_target("http://127.0.0.1:9/hook", true)
                .await
                .is_ok()
        );
        assert!(
            allowed_target("http://93.184.216.34/hook", false)
                .await
                .is_ok()
        );
        assert!(
            allowed_target("https://93.184.216.34/hook", false)
                .await
                .is_ok(),
            "https webhooks are posted over TLS"
        );
        assert!(
            allowed_target("ftp://93.184.216.34/hook", false)
                .await
                .is_err()
        );
    }
}
