//! OpenAPI documents served at /openapi/v2 and /openapi/v3, generated once at start-up
//! from the API types (see virt-apimachinery's openapi module).

use crate::discovery::Doc;
use crate::state::OpenApiDocs;
use virt_apimachinery::openapi::OpenApiDocuments;

fn doc(body: Vec<u8>, hash: &str) -> Doc {
    Doc {
        body: body.into(),
        etag: format!("\"{hash}\""),
    }
}

/// Builds the served OpenAPI documents.
pub fn build() -> OpenApiDocs {
    let d = OpenApiDocuments::build();
    OpenApiDocs {
        v2: Some(doc(d.v2, &d.v2_hash)),
        v3_root: Some(doc(d.v3_root, &d.v3_root_hash)),
        v3: d
            .v3
            .into_iter()
            .map(|(k, (body, hash))| (k, doc(body, &hash)))
            .collect(),
    }
}
