//! Reads: an object in the version the client asked for, and lists with selectors and paging.

use super::*;

impl Cluster {
    /// Renders a stored object in the requested version.
    pub fn present(info: &ResourceInfo, obj: &Arc<Value>) -> Arc<Value> {
        if !convert::needs_conversion(info, obj) {
            return obj.clone();
        }
        Arc::new(convert::from_storage(info, obj))
    }

    pub fn get(&self, info: &ResourceInfo, ns: &str, name: &str) -> Result<Arc<Value>> {
        self.store
            .get(&info.storage_key(), &Self::obj_key_for(info, ns, name))
            .map(|o| Self::present(info, o))
            .ok_or_else(|| ApiError::not_found(&info.group, &info.plural, name))
    }

    pub fn list(
        &self,
        info: &ResourceInfo,
        ns: Option<&str>,
        opts: &ListOptions,
    ) -> Result<ListResult> {
        let key = info.storage_key();
        let ns = ns.filter(|n| !n.is_empty() && info.namespaced);
        let (mut rv, mut after) = (self.store.resource_version(), None);
        if let Some(token) = &opts.continue_token {
            let decoded = util::hex_decode(token).ok_or_else(|| {
                ApiError::bad_request(
                    "continue key is not valid: illegal base64 data at input byte 0",
                )
            })?;
            let mut parts = decoded.splitn(3, '|');
            let (Some(r), Some(n), Some(m)) = (parts.next(), parts.next(), parts.next()) else {
                return Err(ApiError::bad_request(
                    "continue key is not valid: incorrect encoded start resourceVersion",
                ));
            };
            rv = r
                .parse()
                .map_err(|_| ApiError::bad_request("continue key is not valid"))?;
            after = Some((n.to_string(), m.to_string()));
        }
        let mut items = vec![];
        let mut next = None;
        let mut remaining = 0usize;
        let exact_name = opts.fields.exact_name();
        for (k, obj) in self.store.list(&key, ns) {
            if let Some(a) = &after
                && k <= a
            {
                continue;
            }
            if exact_name.is_some_and(|n| n != k.1) {
                continue;
            }
            if !opts.labels.matches(obj) || !opts.fields.matches(obj) {
                continue;
            }
            if let Some(limit) = opts.limit
                && items.len() >= limit
            {
                if next.is_none() {
                    let last: &Arc<Value> =
                        items.last().expect("limit > 0 means an item was taken");
                    let (ln, lm) = obj_key(last);
                    next = Some(util::hex_encode(&format!("{rv}|{ln}|{lm}")));
                }
                remaining += 1;
                continue;
            }
            items.push(Self::present(info, obj));
        }
        Ok(ListResult {
            items,
            resource_version: rv,
            remaining: next.as_ref().map(|_| remaining),
            continue_token: next,
        })
    }
}
