//! Finding the multipart uploads of an object still in progress ([`UploadLister`]): what lets
//! [`ObjectStoreStorage`](crate::ObjectStoreStorage) abort an upload whose create request
//! succeeded on the store but whose answer was lost.
//!
//! `object_store` aborts a multipart upload by its id only
//! ([`MultipartStore::abort_multipart`](object_store::multipart::MultipartStore::abort_multipart))
//! and has no call listing the uploads of a key, nor an idempotent create: when a create request
//! times out or its connection is cut after the store created the upload, its id is lost, and the
//! retry creates a second upload. S3's `ListMultipartUploads` (with the key as prefix) returns
//! the ids; `S3UploadLister` (feature `s3`) sends it as a URL presigned by the store itself.

use async_trait::async_trait;
use object_store::MultipartId;
use object_store::path::Path;

/// Lists the multipart uploads of one object that are in progress: created, neither completed
/// nor aborted.
///
/// Given to [`ObjectStoreStorage::with_upload_lister`](crate::ObjectStoreStorage::with_upload_lister)
/// (`from_url` gives S3 stores an `S3UploadLister`, feature `s3`): after a streamed upload
/// whose create request failed ambiguously (a transient error or a timeout: the store may have
/// created an upload whose id never reached us), the storage lists the key's uploads in
/// progress and aborts each through its `MultipartStore` API.
#[async_trait]
pub trait UploadLister: Send + Sync + std::fmt::Debug + 'static {
    /// The ids of the multipart uploads of exactly `path` (not of the paths it is a prefix of)
    /// in progress. One call may be several requests (pages); a failure is the store's error.
    async fn in_progress(&self, path: &Path) -> object_store::Result<Vec<MultipartId>>;
}

#[cfg(feature = "s3")]
pub(crate) use s3::ClientCapture;
#[cfg(feature = "s3")]
pub use s3::S3UploadLister;

#[cfg(feature = "s3")]
mod s3 {
    use super::UploadLister;
    use async_trait::async_trait;
    use object_store::MultipartId;
    use object_store::aws::AmazonS3;
    use object_store::client::{
        ClientOptions, HttpClient, HttpConnector, HttpRequest, HttpRequestBody, ReqwestConnector,
    };
    use object_store::path::Path;
    use object_store::signer::{Method, SignedUrlOptions, Signer};
    use std::sync::Arc;
    use std::time::Duration;

    /// How long a listing URL stays valid: it is used at once.
    const URL_EXPIRY: Duration = Duration::from_secs(300);

    /// The most pages one listing reads (S3 pages hold up to 1000 uploads; a key has a few).
    const MAX_PAGES: usize = 100;

    /// [`UploadLister`] for Amazon S3 and S3-compatible stores: S3's `ListMultipartUploads`
    /// (`GET /?uploads&prefix=<key>`, paged with `key-marker` and `upload-id-marker`), which
    /// `object_store` does not expose, sent as a URL presigned by the store
    /// ([`Signer::signed_url_opts`]: its credentials, region, endpoint and addressing style)
    /// through an HTTP client of the store's client options. The uploads of other keys that the
    /// key is a prefix of are left out.
    ///
    /// [`ObjectStoreStorage::from_url`](crate::ObjectStoreStorage::from_url) builds one for
    /// `s3://` URLs, with the very HTTP client of the store it builds. For a store built by hand,
    /// give it a client of the same options:
    ///
    /// ```
    /// use diskless_storage::S3UploadLister;
    /// use diskless_storage::object_store::aws::AmazonS3Builder;
    /// use diskless_storage::object_store::client::{ClientOptions, HttpConnector, ReqwestConnector};
    /// use std::sync::Arc;
    ///
    /// let options = ClientOptions::new();
    /// let store = AmazonS3Builder::new()
    ///     .with_bucket_name("bucket")
    ///     .with_region("eu-west-1")
    ///     .with_access_key_id("id")
    ///     .with_secret_access_key("secret")
    ///     .with_client_options(options.clone())
    ///     .build()
    ///     .unwrap();
    /// let client = ReqwestConnector::default().connect(&options).unwrap();
    /// let lister = S3UploadLister::new(Arc::new(store), client);
    /// # let _ = lister;
    /// ```
    #[derive(Debug, Clone)]
    pub struct S3UploadLister {
        store: Arc<AmazonS3>,
        client: HttpClient,
    }

    impl S3UploadLister {
        /// Lists with URLs presigned by `store`, sent through `client`.
        pub fn new(store: Arc<AmazonS3>, client: HttpClient) -> Self {
            S3UploadLister { store, client }
        }

        /// One page of the uploads whose key starts with `prefix`, after `marker` (the
        /// `NextKeyMarker` and `NextUploadIdMarker` of the page before).
        async fn page(
            &self,
            prefix: &str,
            marker: Option<&(String, String)>,
        ) -> object_store::Result<String> {
            let mut query = vec![("uploads", ""), ("prefix", prefix)];
            if let Some((key, upload)) = marker {
                query.push(("key-marker", key));
                query.push(("upload-id-marker", upload));
            }
            let options = SignedUrlOptions::default().with_query(query);
            // The bucket's root: `<endpoint>/<bucket>/` (path style) or `<bucket endpoint>/`.
            let url = self
                .store
                .signed_url_opts(Method::GET, &Path::default(), URL_EXPIRY, &options)
                .await?;
            let mut request = HttpRequest::new(HttpRequestBody::empty());
            *request.uri_mut() = url
                .as_str()
                .parse()
                .map_err(|e| generic(format!("ListMultipartUploads URL {url}: {e}")))?;
            let response =
                self.client
                    .execute(request)
                    .await
                    .map_err(|e| object_store::Error::Generic {
                        store: "S3",
                        source: Box::new(e),
                    })?;
            let status = response.status();
            let body =
                response
                    .into_body()
                    .bytes()
                    .await
                    .map_err(|e| object_store::Error::Generic {
                        store: "S3",
                        source: Box::new(e),
                    })?;
            let text = String::from_utf8_lossy(&body);
            if !status.is_success() {
                // The status as `object_store` words it, so that it is classified the same way
                // (5xx transient, 4xx permanent), with the start of S3's error document.
                let excerpt: String = text.chars().take(300).collect();
                return Err(generic(format!(
                    "ListMultipartUploads of {prefix:?}: server returned non-2xx status code: \
                     {status}: {excerpt}"
                )));
            }
            Ok(text.into_owned())
        }
    }

    #[async_trait]
    impl UploadLister for S3UploadLister {
        async fn in_progress(&self, path: &Path) -> object_store::Result<Vec<MultipartId>> {
            let key = path.as_ref();
            let mut ids = Vec::new();
            let mut marker = None;
            for _ in 0..MAX_PAGES {
                let xml = self.page(key, marker.as_ref()).await?;
                let page = super::parse_page(&xml, key).map_err(generic)?;
                ids.extend(page.ids);
                match page.next {
                    Some(next) if marker.as_ref() != Some(&next) => marker = Some(next),
                    Some(_) => {
                        return Err(generic(format!(
                            "ListMultipartUploads of {key:?}: the next page starts where the \
                             last one did"
                        )));
                    }
                    None => return Ok(ids),
                }
            }
            tracing::warn!(
                %key,
                pages = MAX_PAGES,
                "ListMultipartUploads: more pages than read; listing the uploads read"
            );
            Ok(ids)
        }
    }

    fn generic(message: String) -> object_store::Error {
        object_store::Error::Generic {
            store: "S3",
            source: message.into(),
        }
    }

    /// The [`HttpConnector`] `from_url` builds S3 stores with: `object_store`'s own
    /// ([`ReqwestConnector`]), keeping the last client it connected. `AmazonS3Builder::build`
    /// connects the store's client last, after the clients of its credential providers, with
    /// the store's [`ClientOptions`] (TLS, proxy, timeouts, plain HTTP allowed or not): that
    /// client is the one [`S3UploadLister`] is given.
    #[derive(Debug, Clone, Default)]
    pub(crate) struct ClientCapture {
        last: Arc<parking_lot::Mutex<Option<HttpClient>>>,
    }

    impl ClientCapture {
        /// The client connected last, if any.
        pub(crate) fn last(&self) -> Option<HttpClient> {
            self.last.lock().clone()
        }
    }

    impl HttpConnector for ClientCapture {
        fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
            let client = ReqwestConnector::default().connect(options)?;
            *self.last.lock() = Some(client.clone());
            Ok(client)
        }
    }
}

/// One page of a `ListMultipartUploadsResult`: the upload ids of exactly `key`, and the markers
/// of the next page if the listing is truncated.
#[cfg_attr(not(feature = "s3"), allow(dead_code))]
#[derive(Debug, PartialEq)]
struct Page {
    ids: Vec<MultipartId>,
    next: Option<(String, String)>,
}

/// Parses a `ListMultipartUploadsResult` document (S3 writes its elements without attributes,
/// its text XML-escaped), keeping the uploads of exactly `key`.
#[cfg_attr(not(feature = "s3"), allow(dead_code))]
fn parse_page(xml: &str, key: &str) -> Result<Page, String> {
    let malformed = |what: &str| format!("malformed ListMultipartUploadsResult ({what})");
    if !xml.contains("<ListMultipartUploadsResult") {
        return Err(malformed("no ListMultipartUploadsResult element"));
    }
    let mut ids = Vec::new();
    for upload in elements(xml, "Upload") {
        let listed_key = first(upload, "Key").ok_or_else(|| malformed("an Upload without Key"))?;
        let id =
            first(upload, "UploadId").ok_or_else(|| malformed("an Upload without UploadId"))?;
        let listed_key = unescape(listed_key).ok_or_else(|| malformed("a Key's escapes"))?;
        if listed_key == key {
            ids.push(unescape(id).ok_or_else(|| malformed("an UploadId's escapes"))?);
        }
    }
    // Only the top-level elements: an `Upload` holds no element of these names.
    let next = match first(xml, "IsTruncated").map(str::trim) {
        Some("true") => {
            let marker = |tag| {
                first(xml, tag)
                    .and_then(unescape)
                    .ok_or_else(|| malformed("a truncated page without next markers"))
            };
            Some((marker("NextKeyMarker")?, marker("NextUploadIdMarker")?))
        }
        _ => None,
    };
    Ok(Page { ids, next })
}

/// The text of each `<tag>…</tag>` element of `xml`, in order (elements without attributes).
fn elements<'a>(xml: &'a str, tag: &str) -> Vec<&'a str> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    let mut found = Vec::new();
    let mut rest = xml;
    while let Some(start) = rest.find(&open) {
        let body = &rest[start + open.len()..];
        let Some(end) = body.find(&close) else {
            break;
        };
        found.push(&body[..end]);
        rest = &body[end + close.len()..];
    }
    found
}

/// The text of the first `<tag>…</tag>` element of `xml`.
fn first<'a>(xml: &'a str, tag: &str) -> Option<&'a str> {
    elements(xml, tag).into_iter().next()
}

/// XML text with its entity and character references replaced; `None` if one is malformed.
fn unescape(text: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        let tail = &rest[at + 1..];
        let end = tail.find(';')?;
        let c = match &tail[..end] {
            "lt" => '<',
            "gt" => '>',
            "amp" => '&',
            "quot" => '"',
            "apos" => '\'',
            entity => {
                let number = entity.strip_prefix('#')?;
                let code = match number.strip_prefix(['x', 'X']) {
                    Some(hex) => u32::from_str_radix(hex, 16).ok()?,
                    None => number.parse().ok()?,
                };
                char::from_u32(code)?
            }
        };
        out.push(c);
        rest = &tail[end + 1..];
    }
    out.push_str(rest);
    Some(out)
}

#[cfg(test)]
// Also when clippy runs without the workspace's clippy.toml (allow-unwrap-in-tests).
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    const PAGE: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<ListMultipartUploadsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Bucket>bucket</Bucket><KeyMarker></KeyMarker><UploadIdMarker/>
  <NextKeyMarker>root/a&amp;b</NextKeyMarker><NextUploadIdMarker>id-3</NextUploadIdMarker>
  <Prefix>root/a&amp;b</Prefix><MaxUploads>1000</MaxUploads><IsTruncated>true</IsTruncated>
  <Upload><Key>root/a&amp;b</Key><UploadId>id-1</UploadId>
    <Initiator><ID>x</ID><DisplayName>me</DisplayName></Initiator>
    <Owner><ID>x</ID><DisplayName>me</DisplayName></Owner>
    <StorageClass>STANDARD</StorageClass><Initiated>2024-01-01T00:00:00.000Z</Initiated></Upload>
  <Upload><Key>root/a&amp;b2</Key><UploadId>id-2</UploadId></Upload>
  <Upload><Key>root/a&#38;b</Key><UploadId>id~3&#x2e;</UploadId></Upload>
</ListMultipartUploadsResult>"#;

    #[test]
    fn a_page_gives_the_uploads_of_exactly_the_key_and_the_next_markers() {
        let page = parse_page(PAGE, "root/a&b").unwrap();
        assert_eq!(page.ids, ["id-1", "id~3."]);
        assert_eq!(
            page.next,
            Some(("root/a&b".to_string(), "id-3".to_string()))
        );
        assert_eq!(parse_page(PAGE, "root/a&b2").unwrap().ids, ["id-2"]);
        assert!(parse_page(PAGE, "root/a").unwrap().ids.is_empty());
    }

    #[test]
    fn a_last_page_has_no_next_markers() {
        let last = PAGE.replace(
            "<IsTruncated>true</IsTruncated>",
            "<IsTruncated>false</IsTruncated>",
        );
        assert_eq!(parse_page(&last, "root/a&b").unwrap().next, None);
        let empty = "<ListMultipartUploadsResult><IsTruncated>false</IsTruncated>\
                     </ListMultipartUploadsResult>";
        assert_eq!(
            parse_page(empty, "k").unwrap(),
            Page {
                ids: vec![],
                next: None
            }
        );
    }

    #[test]
    fn malformed_documents_are_errors() {
        for xml in [
            "<ListBucketResult></ListBucketResult>",
            "<ListMultipartUploadsResult><Upload><UploadId>i</UploadId></Upload>",
            "<ListMultipartUploadsResult><Upload><Key>k</Key></Upload>",
            "<ListMultipartUploadsResult><Upload><Key>k&bogus;</Key><UploadId>i</UploadId></Upload>",
            "<ListMultipartUploadsResult><IsTruncated>true</IsTruncated>",
        ] {
            assert!(parse_page(xml, "k").is_err(), "{xml}");
        }
    }

    #[test]
    fn unescapes_entities_and_character_references() {
        assert_eq!(
            unescape("a&lt;b&gt;&amp;&quot;&apos;&#65;&#x42;").unwrap(),
            "a<b>&\"'AB"
        );
        assert_eq!(unescape("plain").unwrap(), "plain");
        for bad in ["&", "&amp", "&#xZZ;", "&#1114112;", "&nbsp;"] {
            assert_eq!(unescape(bad), None, "{bad}");
        }
    }
}
