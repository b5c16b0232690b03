//! What the multipart tests' store wrappers share: an S3-like failure status and the
//! `ObjectStore` methods every wrapper passes through to its `inner` store unchanged.

#![allow(dead_code)]

use diskless_storage::object_store;

/// An error as `object_store`'s HTTP client reports a non-2xx answer (`text`: e.g.
/// `"503 Service Unavailable"`), which `ObjectStoreStorage` classifies by its status code.
pub(crate) fn status(text: &'static str) -> object_store::Error {
    #[derive(Debug, thiserror::Error)]
    #[error("Server returned non-2xx status code: {0}: <Error/>")]
    struct Status(&'static str);
    object_store::Error::Generic {
        store: "faulty",
        source: Box::new(Status(text)),
    }
}

/// A 503, the transient failure.
pub(crate) fn unavailable() -> object_store::Error {
    status("503 Service Unavailable")
}

/// A 400, a permanent failure.
pub(crate) fn bad_request() -> object_store::Error {
    status("400 Bad Request")
}

/// `impl ObjectStore` (and `Display`) for a test wrapper with a field `inner` (the wrapped
/// store): the items given (at least `put_multipart_opts`, the method the multipart tests script)
/// and every other required method passed through to `inner`.
///
/// ```ignore
/// object_store_wrapper!(impl<S: ObjectStore> for Faulty<S> {
///     async fn put_multipart_opts(&self, location: &Path, opts: PutMultipartOptions)
///         -> object_store::Result<Box<dyn MultipartUpload>> { ... }
/// });
/// ```
macro_rules! object_store_wrapper {
    (impl $(<$g:ident: $bound:path>)? for $ty:ty { $($items:tt)* }) => {
        impl $(<$g>)? std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{}", stringify!($ty))
            }
        }

        #[async_trait::async_trait]
        impl $(<$g: $bound>)? diskless_storage::object_store::ObjectStore for $ty {
            $($items)*

            async fn put_opts(
                &self,
                location: &diskless_storage::object_store::path::Path,
                payload: diskless_storage::object_store::PutPayload,
                opts: diskless_storage::object_store::PutOptions,
            ) -> diskless_storage::object_store::Result<diskless_storage::object_store::PutResult> {
                self.inner.put_opts(location, payload, opts).await
            }

            async fn get_opts(
                &self,
                location: &diskless_storage::object_store::path::Path,
                options: diskless_storage::object_store::GetOptions,
            ) -> diskless_storage::object_store::Result<diskless_storage::object_store::GetResult> {
                self.inner.get_opts(location, options).await
            }

            fn delete_stream(
                &self,
                locations: futures::stream::BoxStream<
                    'static,
                    diskless_storage::object_store::Result<diskless_storage::object_store::path::Path>,
                >,
            ) -> futures::stream::BoxStream<
                'static,
                diskless_storage::object_store::Result<diskless_storage::object_store::path::Path>,
            > {
                self.inner.delete_stream(locations)
            }

            fn list(
                &self,
                prefix: Option<&diskless_storage::object_store::path::Path>,
            ) -> futures::stream::BoxStream<
                'static,
                diskless_storage::object_store::Result<diskless_storage::object_store::ObjectMeta>,
            > {
                self.inner.list(prefix)
            }

            async fn list_with_delimiter(
                &self,
                prefix: Option<&diskless_storage::object_store::path::Path>,
            ) -> diskless_storage::object_store::Result<diskless_storage::object_store::ListResult> {
                self.inner.list_with_delimiter(prefix).await
            }

            async fn copy_opts(
                &self,
                from: &diskless_storage::object_store::path::Path,
                to: &diskless_storage::object_store::path::Path,
                options: diskless_storage::object_store::CopyOptions,
            ) -> diskless_storage::object_store::Result<()> {
                self.inner.copy_opts(from, to, options).await
            }
        }
    };
}
pub(crate) use object_store_wrapper;
