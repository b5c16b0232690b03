//! [`ObjectStoreStorage::from_url`]: a storage from a URL and backend options. Each cloud backend
//! sits behind its cargo feature (`s3`, `gcs`, `azure`); all of them are built by one path,
//! [`cloud_store`], that differs only in the `object_store` builder it is given.

use crate::{ObjectStoreStorage, StorageError, UploadLister};
use object_store::ObjectStore;
use object_store::multipart::MultipartStore;
use object_store::path::Path;
use std::sync::Arc;

/// Backend options in the order they apply (the URL's query first, then the caller's).
type Options = Vec<(String, String)>;

/// One store built once, as both traits [`ObjectStoreStorage`] uses: its [`ObjectStore`] and its
/// [`MultipartStore`] API (see [`ObjectStoreStorage::with_multipart_store`]); and the lister of
/// its multipart uploads in progress where there is one (S3: see
/// [`ObjectStoreStorage::with_upload_lister`]).
type Stores = (
    Arc<dyn ObjectStore>,
    Arc<dyn MultipartStore>,
    Option<Arc<dyn UploadLister>>,
);

impl ObjectStoreStorage {
    /// Storage from a URL and backend options:
    ///
    /// - `memory:///prefix`: in memory;
    /// - `file:///absolute/path`: the local filesystem (feature `fs`, see
    ///   [`ObjectStoreStorage::local_fs`]);
    /// - `s3://bucket/prefix` (feature `s3`; also `s3a://`), `gs://bucket/prefix` (feature `gcs`),
    ///   `az://container/prefix` (feature `azure`; also `azure://`, `abfs://`, `abfss://`,
    ///   `adl://`).
    ///
    /// The cloud backends first read their standard environment variables, as the `object_store`
    /// builders' `from_env` do (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
    /// `AWS_DEFAULT_REGION`, `AWS_ENDPOINT`, `AWS_ALLOW_HTTP`, ...; `GOOGLE_*`; `AZURE_*`), then the
    /// URL's query parameters, then `options`, each overriding the one before. The keys are the
    /// `object_store` builder's configuration keys, e.g. `aws_endpoint`, `aws_region`,
    /// `aws_access_key_id`, `aws_secret_access_key`, `aws_allow_http`,
    /// `aws_virtual_hosted_style_request`, `google_service_account`, `azure_storage_account_name`,
    /// `timeout`. An unknown key in the URL or `options` is an error, and so is a scheme whose
    /// cargo feature is off (the error names the feature). `object_store`'s own HTTP retries are
    /// turned off: [`ObjectStoreStorage`] retries (and counts) every attempt itself.
    ///
    /// Memory, S3, GCS and Azure stores are also given as their [`MultipartStore`] API
    /// ([`ObjectStoreStorage::with_multipart_store`]): the parts of streamed uploads are retried.
    /// S3 stores are also given an `S3UploadLister` (feature `s3`)
    /// ([`ObjectStoreStorage::with_upload_lister`]) sending through the store's own HTTP client:
    /// a multipart upload whose create answer was lost is aborted.
    ///
    /// ```
    /// use diskless_storage::{ObjectStoreStorage, StorageError};
    /// let no_options = std::iter::empty::<(&str, &str)>();
    /// let storage = ObjectStoreStorage::from_url("memory:///wal-root", no_options).unwrap();
    /// assert_eq!(storage.prefix(), "wal-root");
    /// let options = [("aws_region", "eu-west-1"), ("aws_access_key_id", "id")];
    /// let err = ObjectStoreStorage::from_url("ftp://host/x", options).unwrap_err();
    /// assert!(matches!(err, StorageError::Config(_)));
    /// ```
    pub fn from_url<I, K, V>(url: &str, options: I) -> Result<Self, StorageError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: Into<String>,
    {
        let parsed = url::Url::parse(url)
            .map_err(|e| StorageError::Config(format!("invalid storage URL {url:?}: {e}")))?;
        let mut opts: Options = parsed
            .query_pairs()
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        opts.extend(
            options
                .into_iter()
                .map(|(k, v)| (k.as_ref().to_string(), v.into())),
        );
        let prefix = Path::from_url_path(parsed.path())
            .map_err(|e| StorageError::Config(format!("invalid path in storage URL {url:?}: {e}")))?
            .to_string();
        let mut base = parsed.clone();
        base.set_query(None);
        base.set_fragment(None);
        let scheme = parsed.scheme().to_ascii_lowercase();
        let cloud = Cloud {
            scheme: &scheme,
            url,
            base: base.as_str(),
        };
        let (store, multipart, lister): Stores = match scheme.as_str() {
            "memory" => {
                no_options(&scheme, &opts)?;
                let store = Arc::new(object_store::memory::InMemory::new());
                (store.clone(), store, None)
            }
            "file" => {
                no_options(&scheme, &opts)?;
                return local_fs_url(url, &parsed);
            }
            "s3" | "s3a" => cloud.s3(opts)?,
            "gs" => cloud.gcs(opts)?,
            "az" | "azure" | "abfs" | "abfss" | "adl" => cloud.azure(opts)?,
            other => {
                return Err(StorageError::Config(format!(
                    "unsupported storage URL scheme {other:?} in {url:?} \
                     (expected memory, file, s3, gs or az)"
                )));
            }
        };
        let storage = Self::from_object_store(store, &prefix)?.with_multipart_store(multipart);
        Ok(match lister {
            Some(lister) => storage.with_upload_lister(lister),
            None => storage,
        })
    }
}

/// `memory://` and `file://` take no options.
fn no_options(scheme: &str, opts: &Options) -> Result<(), StorageError> {
    match opts.first() {
        Some((k, _)) => Err(StorageError::Config(format!(
            "option {k:?} is not valid for a {scheme}:// URL"
        ))),
        None => Ok(()),
    }
}

#[cfg(feature = "fs")]
fn local_fs_url(url: &str, parsed: &url::Url) -> Result<ObjectStoreStorage, StorageError> {
    let path = parsed.to_file_path().map_err(|()| {
        StorageError::Config(format!(
            "invalid file URL {url:?}: expected file:///absolute/path"
        ))
    })?;
    ObjectStoreStorage::local_fs(path)
}

#[cfg(not(feature = "fs"))]
fn local_fs_url(_url: &str, _parsed: &url::Url) -> Result<ObjectStoreStorage, StorageError> {
    Err(feature_off("file", "fs"))
}

/// The part of a cloud URL every backend needs (a backend whose feature is off reads only the
/// scheme, one whose feature is on all but the scheme).
#[allow(dead_code)] // Which fields are read depends on the features.
struct Cloud<'a> {
    /// The URL's scheme, lower case (named in the error when its feature is off).
    scheme: &'a str,
    /// The whole URL, for error messages.
    url: &'a str,
    /// The URL without query and fragment, given to the builder's `with_url`.
    base: &'a str,
}

/// Builds one cloud backend behind its cargo feature: with the feature on, the `object_store`
/// builder of `$builder` goes through [`cloud_store`] (the store as both its traits); with it
/// off, the URL is refused with an error naming the feature.
macro_rules! cloud_backend {
    ($method:ident, $feature:literal, $name:literal, $builder:path, $key:path) => {
        impl Cloud<'_> {
            #[cfg(feature = $feature)]
            fn $method(&self, opts: Options) -> Result<Stores, StorageError> {
                use $builder as Builder;
                let store = cloud_store::<$key, _, _>(
                    $name,
                    self.url,
                    Builder::from_env().with_url(self.base),
                    opts,
                    Builder::with_config,
                    |builder| builder.with_retry(no_internal_retries()).build(),
                )?;
                Ok((store.clone(), store, None))
            }

            #[cfg(not(feature = $feature))]
            fn $method(&self, _opts: Options) -> Result<Stores, StorageError> {
                Err(feature_off(self.scheme, $feature))
            }
        }
    };
}

impl Cloud<'_> {
    /// S3, as [`cloud_backend`] builds the others, plus an [`S3UploadLister`] sending through
    /// the HTTP client the store was built with (captured by its connector).
    ///
    /// [`S3UploadLister`]: crate::S3UploadLister
    #[cfg(feature = "s3")]
    fn s3(&self, opts: Options) -> Result<Stores, StorageError> {
        use object_store::aws::{AmazonS3Builder as Builder, AmazonS3ConfigKey};
        let capture = crate::uploads::ClientCapture::default();
        let store = cloud_store::<AmazonS3ConfigKey, _, _>(
            "s3",
            self.url,
            Builder::from_env().with_url(self.base),
            opts,
            Builder::with_config,
            |builder| {
                builder
                    .with_retry(no_internal_retries())
                    .with_http_connector(capture.clone())
                    .build()
            },
        )?;
        let lister = capture.last().map(|client| {
            Arc::new(crate::S3UploadLister::new(store.clone(), client)) as Arc<dyn UploadLister>
        });
        Ok((store.clone(), store, lister))
    }

    #[cfg(not(feature = "s3"))]
    fn s3(&self, _opts: Options) -> Result<Stores, StorageError> {
        Err(feature_off(self.scheme, "s3"))
    }
}
cloud_backend!(
    gcs,
    "gcs",
    "gcs",
    object_store::gcp::GoogleCloudStorageBuilder,
    object_store::gcp::GoogleConfigKey
);
cloud_backend!(
    azure,
    "azure",
    "azure",
    object_store::azure::MicrosoftAzureBuilder,
    object_store::azure::AzureConfigKey
);

/// The one path of every cloud backend: `builder` (already read from the environment and given
/// the URL), then each option in order (an unknown key is an error), then `build`; the store built
/// is returned to be used as both its [`ObjectStore`] and its [`MultipartStore`].
#[cfg(any(feature = "s3", feature = "gcs", feature = "azure"))]
fn cloud_store<K, B, S>(
    name: &str,
    url: &str,
    mut builder: B,
    opts: Options,
    with_config: impl Fn(B, K, String) -> B,
    build: impl FnOnce(B) -> object_store::Result<S>,
) -> Result<Arc<S>, StorageError>
where
    K: std::str::FromStr,
    S: ObjectStore + MultipartStore,
{
    for (k, v) in opts {
        let key: K = k
            .to_ascii_lowercase()
            .parse()
            .map_err(|_| StorageError::Config(format!("unknown {name} option {k:?}")))?;
        builder = with_config(builder, key, v);
    }
    let store =
        build(builder).map_err(|e| StorageError::Config(format!("{name} store {url:?}: {e}")))?;
    Ok(Arc::new(store))
}

/// `object_store`'s internal HTTP retries: off, [`ObjectStoreStorage`] retries itself.
#[cfg(any(feature = "s3", feature = "gcs", feature = "azure"))]
fn no_internal_retries() -> object_store::RetryConfig {
    object_store::RetryConfig {
        max_retries: 0,
        ..Default::default()
    }
}

#[cfg(not(all(feature = "s3", feature = "gcs", feature = "azure", feature = "fs")))]
fn feature_off(scheme: &str, feature: &str) -> StorageError {
    StorageError::Config(format!(
        "{scheme}:// storage needs the cargo feature `{feature}` of diskless-storage"
    ))
}
