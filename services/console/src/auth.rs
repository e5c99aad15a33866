//! Who a request is from: the session cookie, the CSRF rules, the access a route needs.
//! Every `/api` route but `login` calls [`Console::signed`] first; the person a request acts as
//! is the session's, never a body field.

use axum::http::{HeaderMap, Method, header};
use switchboard_runtime::people_book::Access;

use crate::Console;
use crate::error::ApiError;
use crate::store::Signed;

/// The session cookie's name.
pub const COOKIE: &str = "sb_session";

/// The session cookie's value.
pub(crate) fn cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .find_map(|pair| {
            pair.trim()
                .strip_prefix(&format!("{COOKIE}="))
                .map(str::to_owned)
        })
}

/// A browser-sent request from another site, or a form post: refused before anything runs.
pub(crate) fn cross_site(headers: &HeaderMap) -> Result<(), ApiError> {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !json {
        return Err(ApiError::Csrf("send JSON (Content-Type: application/json)"));
    }
    let site = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok());
    if site.is_some_and(|site| site != "same-origin" && site != "none") {
        return Err(ApiError::Csrf("requests from another site are refused"));
    }
    Ok(())
}

impl Console {
    /// The signed-in person; for a state-changing request the CSRF token and origin too.
    pub(crate) fn signed(&self, headers: &HeaderMap, method: &Method) -> Result<Signed, ApiError> {
        let signed = cookie(headers)
            .and_then(|value| self.sessions.check(&value))
            .ok_or(ApiError::SignIn)?;
        if method != Method::GET && method != Method::HEAD {
            cross_site(headers)?;
            let sent = headers
                .get("x-csrf-token")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            if !crate::store::same(sent, &signed.session.csrf) {
                return Err(ApiError::Csrf("missing or wrong X-CSRF-Token"));
            }
        }
        Ok(signed)
    }

    pub(crate) fn needs(&self, signed: &Signed, access: Access) -> Result<(), ApiError> {
        if signed.may(access) {
            Ok(())
        } else {
            Err(ApiError::Forbidden(format!(
                "person:{} has no {} access",
                signed.person.id,
                match access {
                    Access::Viewer => "viewer",
                    Access::Operator => "operator",
                    Access::Approver => "approver",
                }
            )))
        }
    }
}

/// A JSON body, read only after the request passed the session and CSRF checks (an extractor
/// would answer a form post before them).
pub(crate) fn body<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|err| ApiError::BadRequest(format!("invalid body: {err}")))
}
