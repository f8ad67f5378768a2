//! Questions every controller asks of a failed API call: was it a conflict (a stale cache, retry
//! soon), a 404, a 403? Asked of a `kube::Error` or of any error whose source chain holds one.

/// The `kube::Error` in `error`'s source chain (itself included), if any.
pub fn find_kube_error<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a kube::Error> {
    let mut current = Some(error);
    while let Some(error) = current {
        if let Some(kube) = error.downcast_ref::<kube::Error>() {
            return Some(kube);
        }
        current = error.source();
    }
    None
}

/// The HTTP status code of an API error response.
pub fn status_code(error: &kube::Error) -> Option<u16> {
    match error {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

/// A 409: a guarded write lost a race, or a create found the name taken (the cache was stale).
pub fn is_conflict(error: &kube::Error) -> bool {
    status_code(error) == Some(409)
}

/// A 404 from the API server.
pub fn is_not_found(error: &kube::Error) -> bool {
    status_code(error) == Some(404)
}

/// A 403: the ServiceAccount lacks a permission (the API request span logs which one).
pub fn is_forbidden(error: &kube::Error) -> bool {
    status_code(error) == Some(403)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("message", reason)
                .with_code(code)
                .boxed(),
        )
    }

    #[derive(Debug, thiserror::Error)]
    #[error("patching status of {machine}")]
    struct PatchStatus {
        machine: String,
        #[source]
        source: kube::Error,
    }

    #[test]
    fn classifies_status_codes() {
        assert!(is_conflict(&api(409, "Conflict")));
        assert!(is_conflict(&api(409, "AlreadyExists")));
        assert!(!is_conflict(&api(422, "Invalid")));
        assert!(is_not_found(&api(404, "NotFound")));
        assert!(is_forbidden(&api(403, "Forbidden")));
        assert!(!is_forbidden(&api(401, "Unauthorized")));
    }

    #[test]
    fn finds_the_kube_error_behind_a_wrapping_error() {
        let wrapped = PatchStatus {
            machine: "m-1".into(),
            source: api(409, "Conflict"),
        };
        let found = find_kube_error(&wrapped).expect("in the source chain");
        assert!(is_conflict(found));
        let plain = std::io::Error::other("no kube error here");
        assert!(find_kube_error(&plain).is_none());
    }
}
