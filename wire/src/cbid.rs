//! CUPTI callback ids and the CUDA API functions they stand for: CUPTI's
//! vocabulary, kept with the wire protocol so that the shim, the importer
//! of PyTorch traces and the analysis all read one table.

use std::borrow::Cow;

use crate::record::ApiDomain;

/// The CUDA API function a CUPTI callback id stands for.
pub fn api_name(domain: ApiDomain, cbid: u32) -> Cow<'static, str> {
    let table = match domain {
        ApiDomain::Runtime => crate::cbid_names::RUNTIME,
        ApiDomain::Driver => crate::cbid_names::DRIVER,
    };
    match table.binary_search_by_key(&cbid, |&(id, _)| id) {
        Ok(i) => Cow::Borrowed(table[i].1),
        Err(_) => Cow::Owned(format!("{domain:?}#{cbid}")),
    }
}

/// The CUPTI callback id of a CUDA API function, by name ("cudaLaunchKernel",
/// with or without a version suffix).
pub fn cbid_of(domain: ApiDomain, name: &str) -> Option<u32> {
    let table = match domain {
        ApiDomain::Runtime => crate::cbid_names::RUNTIME,
        ApiDomain::Driver => crate::cbid_names::DRIVER,
    };
    let base = name.split("_v").next().unwrap_or(name);
    table.iter().find(|(_, n)| *n == base).map(|(id, _)| *id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn callback_ids_name_their_functions() {
        assert_eq!(api_name(ApiDomain::Runtime, 211), "cudaLaunchKernel");
        assert_eq!(api_name(ApiDomain::Runtime, 131), "cudaStreamSynchronize");
        assert_eq!(api_name(ApiDomain::Driver, 307), "cuLaunchKernel");
        assert_eq!(api_name(ApiDomain::Driver, 999_999), "Driver#999999");
    }
}
