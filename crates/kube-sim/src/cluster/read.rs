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

    /// The JSON of a stored object in the requested version: its stored bytes unless it must be
    /// converted.
    pub fn present_json(info: &ResourceInfo, obj: &Stored) -> Bytes {
        match obj.api_version() {
            Some(av) if info.is_api_version(&av) => obj.json().clone(),
            _ => Stored::encode(&convert::from_storage(info, &obj.value()))
                .json()
                .clone(),
        }
    }

    pub fn get(&self, info: &ResourceInfo, ns: &str, name: &str) -> Result<Arc<Value>> {
        self.store
            .get(&info.storage_key(), &Self::obj_key_for(info, ns, name))
            .map(|o| Self::present(info, &o))
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
        let selects = !opts.labels.is_empty() || !opts.fields.is_empty();
        let mut last_key: Option<&ObjKey> = None;
        for (k, obj) in self.store.list(&key, ns) {
            if let Some(a) = &after
                && k <= a
            {
                continue;
            }
            if exact_name.is_some_and(|n| n != k.1) {
                continue;
            }
            if selects {
                let tree = obj.value();
                if !opts.labels.matches(&tree) || !opts.fields.matches(&tree) {
                    continue;
                }
            }
            if let Some(limit) = opts.limit
                && items.len() >= limit
            {
                if next.is_none()
                    && let Some((ln, lm)) = last_key
                {
                    next = Some(util::hex_encode(&format!("{rv}|{ln}|{lm}")));
                }
                remaining += 1;
                continue;
            }
            last_key = Some(k);
            items.push(Self::present_json(info, obj));
        }
        Ok(ListResult {
            items,
            resource_version: rv,
            remaining: next.as_ref().map(|_| remaining),
            continue_token: next,
        })
    }
}
