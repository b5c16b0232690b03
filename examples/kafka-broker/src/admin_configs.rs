//! Topic and broker configs as Kafka clients see them: Kafka's topic configs (names, types, defaults,
//! valid values and broker synonyms, as Kafka's `LogConfig` and `ServerTopicConfigSynonyms` define
//! them), and DescribeConfigs, IncrementalAlterConfigs and AlterConfigs.
//!
//! What a topic config does on a diskless topic:
//! - **applied** (kept by the coordinator in [`TopicConfig`], enforced by the writer, the
//!   retention task and the tiering worker): `retention.ms`, `retention.bytes`,
//!   `max.message.bytes`, `message.timestamp.type`, `message.timestamp.before.max.ms`,
//!   `message.timestamp.after.max.ms`, and the tiered segments' `segment.bytes`, `segment.ms`,
//!   `index.interval.bytes`, `segment.index.bytes` (issue 15: a partition's WAL batches are
//!   consolidated into a Kafka log segment once they reach `segment.bytes` or the oldest is
//!   `segment.ms` old), and `compression.type` with `compression.gzip.level`,
//!   `compression.lz4.level`, `compression.zstd.level` (issue 29: the writer re-encodes a batch
//!   whose codec is not the topic's, as Kafka's `LogValidator` does);
//! - **applied** too: `cleanup.policy` (`compact` and `compact,delete` compact the topic's tiered
//!   segments, issue #29), `delete.retention.ms`, `min.compaction.lag.ms`,
//!   `max.compaction.lag.ms`, `min.cleanable.dirty.ratio`;
//! - **refused** with `INVALID_CONFIG`: `remote.storage.enable=true` (no tiered storage), `diskless.enable=false`
//!   (every topic of this broker is diskless);
//! - **accepted and kept** in the broker's store (`broker.db`), without effect: every other config
//!   Kafka knows (`segment.jitter.ms`, flush, compaction, replication and tiered-storage settings).
//!
//! The broker's own defaults for diskless topics differ from Kafka's for two of them: `segment.ms`
//! and `segment.bytes` come from `--segment-ms` and `--segment-bytes` (10 min and 256 MiB by
//! default: `segment.ms` bounds how long a batch's coordinator row lives), described as Kafka
//! describes a `log.roll.ms` / `log.segment.bytes` set in `server.properties`: a
//! `STATIC_BROKER_CONFIG` synonym ahead of Kafka's default.
//!
//! Group resources (`ConfigResource.Type.GROUP`): Kafka 4.0's group configs, checked as Kafka's
//! `GroupConfig` checks them (names, validators, the broker's min/max bounds), kept in the broker's
//! store and described with their broker synonyms; they act on KIP-848 and share groups, which this
//! broker does not serve, so they have no effect.
//!
//! Unknown names are refused with `INVALID_CONFIG` ("Unknown topic config name"), values are checked
//! against Kafka's types and validators. Changes made with the alter APIs take effect at once: the
//! coordinator stores the new [`TopicConfig`] and the topic cache reloads.

use std::collections::BTreeSet;
use std::sync::Arc;

use diskless_coordinator::{CleanupPolicy, TimestampType, TopicCompression, TopicConfig};
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult, DescribeConfigsSynonym,
};
use kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse as IncrementalResult;
use kafka_protocol::messages::{
    AlterConfigsRequest, AlterConfigsResponse, DescribeConfigsRequest, DescribeConfigsResponse,
    IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse,
};
use kafka_protocol::protocol::StrBytes;
use tracing::info;

use crate::broker::Broker;
use crate::codes;
use crate::ctx::{ApiError, Ctx};
use crate::topics::{Overrides, Topic, TopicDefaults};

/// `ConfigResource.Type.TOPIC`.
const RESOURCE_TOPIC: i8 = 2;
/// `ConfigResource.Type.BROKER`.
const RESOURCE_BROKER: i8 = 4;
/// `ConfigResource.Type.BROKER_LOGGER`.
const RESOURCE_BROKER_LOGGER: i8 = 8;
/// `ConfigResource.Type.GROUP` (KIP-848 group configs, Kafka 4.0).
const RESOURCE_GROUP: i8 = 32;

/// `DescribeConfigsResponse.ConfigSource.TOPIC_CONFIG` (Kafka's `DYNAMIC_TOPIC_CONFIG`).
pub(crate) const SOURCE_TOPIC: i8 = 1;
/// `ConfigSource.STATIC_BROKER_CONFIG`.
const SOURCE_STATIC_BROKER: i8 = 4;
/// `ConfigSource.DEFAULT_CONFIG`.
pub(crate) const SOURCE_DEFAULT: i8 = 5;
/// `ConfigSource.GROUP_CONFIG`.
const SOURCE_GROUP: i8 = 8;

/// `AlterConfigOp.OpType`.
const OP_SET: i8 = 0;
const OP_DELETE: i8 = 1;
const OP_APPEND: i8 = 2;
const OP_SUBTRACT: i8 = 3;

/// A config's type (`DescribeConfigsResponse.ConfigType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Boolean,
    String,
    Int,
    Long,
    Double,
    List,
}

impl Kind {
    fn id(self) -> i8 {
        match self {
            Kind::Boolean => 1,
            Kind::String => 2,
            Kind::Int => 3,
            Kind::Long => 5,
            Kind::Double => 6,
            Kind::List => 7,
        }
    }
}

/// A config's validator (Kafka's `ConfigDef` validators).
#[derive(Clone, Copy, Debug)]
enum Check {
    None,
    AtLeast(i64),
    Between(i64, i64),
    /// `-1` (the codec's default) or within the range.
    Level(i64, i64),
    Ratio,
    OneOf(&'static [&'static str]),
    ListOf(&'static [&'static str]),
    /// `*` or `partition:broker` pairs.
    Throttled,
}

/// What a config does on a diskless topic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Effect {
    /// Part of [`TopicConfig`]: enforced.
    Applied,
    /// Accepted and kept, no effect.
    Kept,
}

/// One of Kafka's topic configs.
#[derive(Debug)]
struct Def {
    name: &'static str,
    kind: Kind,
    default: &'static str,
    check: Check,
    /// The broker config that gives the default, with its default value, if Kafka has one (only
    /// the first synonym, as Kafka's DescribeConfigs lists it).
    broker: Option<(&'static str, &'static str)>,
    effect: Effect,
}

const LONG_MAX: &str = "9223372036854775807";

macro_rules! def {
    ($name:literal, $kind:ident, $default:expr, $check:expr, $broker:expr, $effect:ident) => {
        Def {
            name: $name,
            kind: Kind::$kind,
            default: $default,
            check: $check,
            broker: $broker,
            effect: Effect::$effect,
        }
    };
}

/// Kafka's topic configs, sorted by name (Kafka 4.0's `LogConfig`, plus KIP-1150's `diskless.enable`).
#[rustfmt::skip]
const TOPIC_CONFIGS: &[Def] = &[
    def!("cleanup.policy", List, "delete", Check::ListOf(&["compact", "delete"]),
         Some(("log.cleanup.policy", "delete")), Applied),
    def!("compression.gzip.level", Int, "-1", Check::Level(1, 9),
         Some(("compression.gzip.level", "-1")), Applied),
    def!("compression.lz4.level", Int, "9", Check::Between(1, 17),
         Some(("compression.lz4.level", "9")), Applied),
    def!("compression.type", String, "producer", Check::OneOf(&["uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"]),
         Some(("compression.type", "producer")), Applied),
    def!("compression.zstd.level", Int, "3", Check::Between(-131_072, 22),
         Some(("compression.zstd.level", "3")), Applied),
    def!("delete.retention.ms", Long, "86400000", Check::AtLeast(0),
         Some(("log.cleaner.delete.retention.ms", "86400000")), Applied),
    def!("diskless.enable", Boolean, "true", Check::None, None, Kept),
    def!("file.delete.delay.ms", Long, "60000", Check::AtLeast(0),
         Some(("log.segment.delete.delay.ms", "60000")), Kept),
    def!("flush.messages", Long, LONG_MAX, Check::AtLeast(1),
         Some(("log.flush.interval.messages", LONG_MAX)), Kept),
    def!("flush.ms", Long, LONG_MAX, Check::AtLeast(0), None, Kept),
    def!("follower.replication.throttled.replicas", List, "", Check::Throttled, None, Kept),
    def!("index.interval.bytes", Int, "4096", Check::AtLeast(0),
         Some(("log.index.interval.bytes", "4096")), Applied),
    def!("leader.replication.throttled.replicas", List, "", Check::Throttled, None, Kept),
    def!("local.retention.bytes", Long, "-2", Check::AtLeast(-2),
         Some(("log.local.retention.bytes", "-2")), Kept),
    def!("local.retention.ms", Long, "-2", Check::AtLeast(-2),
         Some(("log.local.retention.ms", "-2")), Kept),
    def!("max.compaction.lag.ms", Long, LONG_MAX, Check::AtLeast(1),
         Some(("log.cleaner.max.compaction.lag.ms", LONG_MAX)), Applied),
    def!("max.message.bytes", Int, "1048588", Check::AtLeast(0),
         Some(("message.max.bytes", "1048588")), Applied),
    def!("message.timestamp.after.max.ms", Long, "3600000", Check::AtLeast(0),
         Some(("log.message.timestamp.after.max.ms", "3600000")), Applied),
    def!("message.timestamp.before.max.ms", Long, LONG_MAX, Check::AtLeast(0),
         Some(("log.message.timestamp.before.max.ms", LONG_MAX)), Applied),
    def!("message.timestamp.type", String, "CreateTime", Check::OneOf(&["CreateTime", "LogAppendTime"]),
         Some(("log.message.timestamp.type", "CreateTime")), Applied),
    def!("min.cleanable.dirty.ratio", Double, "0.5", Check::Ratio,
         Some(("log.cleaner.min.cleanable.ratio", "0.5")), Applied),
    def!("min.compaction.lag.ms", Long, "0", Check::AtLeast(0),
         Some(("log.cleaner.min.compaction.lag.ms", "0")), Applied),
    def!("min.insync.replicas", Int, "1", Check::AtLeast(1),
         Some(("min.insync.replicas", "1")), Kept),
    def!("preallocate", Boolean, "false", Check::None, Some(("log.preallocate", "false")), Kept),
    def!("remote.log.copy.disable", Boolean, "false", Check::None, None, Kept),
    def!("remote.log.delete.on.disable", Boolean, "false", Check::None, None, Kept),
    def!("remote.storage.enable", Boolean, "false", Check::None, None, Kept),
    def!("retention.bytes", Long, "-1", Check::None, Some(("log.retention.bytes", "-1")), Applied),
    def!("retention.ms", Long, "604800000", Check::AtLeast(-1), None, Applied),
    // Kafka 4's bound (KIP-1030): at least 1 MiB.
    def!("segment.bytes", Int, "1073741824", Check::AtLeast(1_048_576),
         Some(("log.segment.bytes", "1073741824")), Applied),
    def!("segment.index.bytes", Int, "10485760", Check::AtLeast(4),
         Some(("log.index.size.max.bytes", "10485760")), Applied),
    def!("segment.jitter.ms", Long, "0", Check::AtLeast(0), None, Kept),
    def!("segment.ms", Long, "604800000", Check::AtLeast(1), Some(("log.roll.hours", "168")),
         Applied),
    def!("unclean.leader.election.enable", Boolean, "false", Check::None,
         Some(("unclean.leader.election.enable", "false")), Kept),
];

fn def(name: &str) -> Option<&'static Def> {
    TOPIC_CONFIGS.iter().find(|d| d.name == name)
}

/// The broker config this broker sets (a `STATIC_BROKER_CONFIG` in Kafka's terms) that gives
/// topic config `name` its default, with its value: `log.roll.ms` for `segment.ms`,
/// `log.segment.bytes` for `segment.bytes` (`--segment-ms`, `--segment-bytes`).
fn static_broker(name: &str, defaults: &TopicDefaults) -> Option<(&'static str, String)> {
    match name {
        "segment.ms" => Some(("log.roll.ms", defaults.segment_ms.to_string())),
        "segment.bytes" => Some(("log.segment.bytes", defaults.segment_bytes.to_string())),
        _ => None,
    }
}

/// The value of topic config `d` on a topic of this broker that does not set it.
fn default_value(d: &Def, defaults: &TopicDefaults) -> String {
    static_broker(d.name, defaults).map_or_else(|| d.default.to_string(), |(_, v)| v)
}

/// Kafka 4.0's group configs (`GroupConfig`), sorted by name, with their broker synonyms
/// (`group.` + name, where Kafka has one). The example broker keeps them in its store; they act on
/// KIP-848 consumer groups and share groups, which it does not serve (classic groups take their
/// timeouts from JoinGroup), so they have no effect here.
#[rustfmt::skip]
const GROUP_CONFIGS: &[Def] = &[
    def!("consumer.heartbeat.interval.ms", Int, "5000", Check::AtLeast(1),
         Some(("group.consumer.heartbeat.interval.ms", "5000")), Kept),
    def!("consumer.session.timeout.ms", Int, "45000", Check::AtLeast(1),
         Some(("group.consumer.session.timeout.ms", "45000")), Kept),
    def!("share.auto.offset.reset", String, "latest", Check::OneOf(&["latest", "earliest"]),
         None, Kept),
    def!("share.heartbeat.interval.ms", Int, "5000", Check::AtLeast(1),
         Some(("group.share.heartbeat.interval.ms", "5000")), Kept),
    def!("share.record.lock.duration.ms", Int, "30000", Check::AtLeast(1000),
         Some(("group.share.record.lock.duration.ms", "30000")), Kept),
    def!("share.session.timeout.ms", Int, "45000", Check::AtLeast(1),
         Some(("group.share.session.timeout.ms", "45000")), Kept),
];

/// The broker's bounds on group configs (Kafka 4.0's defaults of `group.consumer.min.*`,
/// `group.consumer.max.*`, `group.share.min.*`, `group.share.max.*`): (config, broker bound, min?, bound).
const GROUP_BOUNDS: &[(&str, &str, bool, i64)] = &[
    (
        "consumer.heartbeat.interval.ms",
        "group.consumer.min.heartbeat.interval.ms",
        true,
        5_000,
    ),
    (
        "consumer.heartbeat.interval.ms",
        "group.consumer.max.heartbeat.interval.ms",
        false,
        15_000,
    ),
    (
        "consumer.session.timeout.ms",
        "group.consumer.min.session.timeout.ms",
        true,
        45_000,
    ),
    (
        "consumer.session.timeout.ms",
        "group.consumer.max.session.timeout.ms",
        false,
        60_000,
    ),
    (
        "share.heartbeat.interval.ms",
        "group.share.min.heartbeat.interval.ms",
        true,
        5_000,
    ),
    (
        "share.heartbeat.interval.ms",
        "group.share.max.heartbeat.interval.ms",
        false,
        15_000,
    ),
    (
        "share.session.timeout.ms",
        "group.share.min.session.timeout.ms",
        true,
        45_000,
    ),
    (
        "share.session.timeout.ms",
        "group.share.max.session.timeout.ms",
        false,
        60_000,
    ),
    (
        "share.record.lock.duration.ms",
        "group.share.min.record.lock.duration.ms",
        true,
        15_000,
    ),
    (
        "share.record.lock.duration.ms",
        "group.share.max.record.lock.duration.ms",
        false,
        60_000,
    ),
];

/// Checks the configs set on a group as Kafka's `GroupConfig.validate` does (known names, types,
/// validators, the broker's bounds, session timeout above heartbeat interval); their canonical values.
fn resolve_group(configs: &[(String, String)]) -> Result<Overrides, ApiError> {
    let set = canonical_set(GROUP_CONFIGS, "group", configs)?;
    let int = |name: &str| -> i64 {
        set.get(name)
            .map(String::as_str)
            .or_else(|| {
                GROUP_CONFIGS
                    .iter()
                    .find(|d| d.name == name)
                    .map(|d| d.default)
            })
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    for (name, bound_name, is_min, bound) in GROUP_BOUNDS {
        let v = int(name);
        if *is_min && v < *bound {
            return Err(ApiError::invalid_config(format!(
                "{name} must be greater than or equal to {bound_name}"
            )));
        }
        if !*is_min && v > *bound {
            return Err(ApiError::invalid_config(format!(
                "{name} must be less than or equal to {bound_name}"
            )));
        }
    }
    for kind in ["consumer", "share"] {
        if int(&format!("{kind}.session.timeout.ms"))
            <= int(&format!("{kind}.heartbeat.interval.ms"))
        {
            return Err(ApiError::invalid_config(format!(
                "{kind}.session.timeout.ms must be greater than {kind}.heartbeat.interval.ms"
            )));
        }
    }
    Ok(set)
}

/// Every group config of a group whose set configs are `set` (Kafka's `createGroupConfigEntry`).
fn group_entries(set: &Overrides, keys: Option<&BTreeSet<String>>) -> Vec<Entry> {
    GROUP_CONFIGS
        .iter()
        .filter(|d| keys.is_none_or(|k| k.contains(d.name)))
        .map(|d| {
            let value = set.get(d.name);
            let mut synonyms = Vec::new();
            if let Some(v) = value {
                synonyms.push((d.name, v.clone(), SOURCE_GROUP));
            }
            // The broker synonym at its default, or (no broker synonym) the group config's
            // default under its own name.
            let (name, default) = d.broker.unwrap_or((d.name, d.default));
            synonyms.push((name, default.to_string(), SOURCE_DEFAULT));
            Entry {
                name: d.name,
                value: value.cloned().unwrap_or_else(|| d.default.to_string()),
                source: if value.is_some() {
                    SOURCE_GROUP
                } else {
                    SOURCE_DEFAULT
                },
                kind: d.kind,
                synonyms,
                doc:
                    "Kafka's group config (KIP-848 consumer and share groups); kept, no effect on \
                      the classic groups this broker serves."
                        .to_string(),
            }
        })
        .collect()
}

fn empty_group_name() -> ApiError {
    ApiError::new(codes::INVALID_REQUEST, "Group name must not be empty")
}

fn invalid_value(name: &str, value: &str, why: &str) -> ApiError {
    ApiError::invalid_config(format!(
        "Invalid value {value} for configuration {name}: {why}"
    ))
}

/// Parses and checks `value` for `def` as Kafka's `ConfigDef` does; the canonical text of the value.
fn canonical(def: &Def, value: &str) -> Result<String, ApiError> {
    let trimmed = value.trim();
    let bad = |why: &str| invalid_value(def.name, value, why);
    let range = |v: i64| -> Result<(), ApiError> {
        match def.check {
            Check::AtLeast(min) if v < min => Err(bad(&format!("Value must be at least {min}"))),
            Check::Between(min, max) if !(min..=max).contains(&v) => {
                Err(bad(&format!("Value must be between {min} and {max}")))
            }
            Check::Level(min, max) if v != -1 && !(min..=max).contains(&v) => Err(bad(&format!(
                "Value must be between {min} and {max}, or -1 (the default level)"
            ))),
            _ => Ok(()),
        }
    };
    match def.kind {
        Kind::Boolean => match trimmed.to_ascii_lowercase().as_str() {
            b @ ("true" | "false") => Ok(b.to_string()),
            _ => Err(bad("Expected value to be either true or false")),
        },
        Kind::Int => {
            let v: i32 = trimmed
                .parse()
                .map_err(|_| bad("Not a number of type INT"))?;
            range(i64::from(v))?;
            Ok(v.to_string())
        }
        Kind::Long => {
            let v: i64 = trimmed
                .parse()
                .map_err(|_| bad("Not a number of type LONG"))?;
            range(v)?;
            Ok(v.to_string())
        }
        Kind::Double => {
            let v: f64 = trimmed
                .parse()
                .map_err(|_| bad("Not a number of type DOUBLE"))?;
            if matches!(def.check, Check::Ratio) && !(0.0..=1.0).contains(&v) {
                return Err(bad("Value must be between 0 and 1"));
            }
            Ok(format!("{v:?}"))
        }
        Kind::String => {
            if let Check::OneOf(allowed) = def.check
                && !allowed.contains(&trimmed)
            {
                return Err(bad(&format!(
                    "String must be one of: {}",
                    allowed.join(", ")
                )));
            }
            Ok(trimmed.to_string())
        }
        Kind::List => {
            let items: Vec<&str> = if trimmed.is_empty() {
                Vec::new()
            } else {
                trimmed.split(',').map(str::trim).collect()
            };
            match def.check {
                Check::ListOf(allowed) => {
                    if let Some(item) = items.iter().find(|i| !allowed.contains(i)) {
                        return Err(invalid_value(
                            def.name,
                            item,
                            &format!("String must be one of: {}", allowed.join(", ")),
                        ));
                    }
                }
                Check::Throttled => {
                    let ok = items == ["*"]
                        || items.iter().all(|i| {
                            i.split_once(':').is_some_and(|(p, b)| {
                                p.trim().parse::<u32>().is_ok() && b.trim().parse::<u32>().is_ok()
                            })
                        });
                    if !ok {
                        return Err(bad(
                            "must be the literal '*' or a list of replicas in the following \
                             format: [partitionId]:[brokerId],[partitionId]:[brokerId],...",
                        ));
                    }
                }
                _ => {}
            }
            Ok(items.join(","))
        }
    }
}

/// The canonical values of `configs` (name, value; the last of a name wins) against the table `defs`:
/// an unknown name is `INVALID_CONFIG` ("Unknown {what} config name"), values are checked in the
/// table's order (Kafka parses in its definition order; ours is by name, close enough).
fn canonical_set(
    defs: &[Def],
    what: &str,
    configs: &[(String, String)],
) -> Result<Overrides, ApiError> {
    if let Some((name, _)) = configs
        .iter()
        .find(|(n, _)| !defs.iter().any(|d| d.name == n))
    {
        return Err(ApiError::invalid_config(format!(
            "Unknown {what} config name: {name}"
        )));
    }
    let mut set = Overrides::new();
    for d in defs {
        if let Some((_, value)) = configs.iter().rev().find(|(n, _)| n == d.name) {
            set.insert(d.name.to_string(), canonical(d, value)?);
        }
    }
    Ok(set)
}

/// Refusals of values a diskless topic cannot honour.
fn diskless_refusal(name: &str, value: &str) -> Option<ApiError> {
    let message = match name {
        "remote.storage.enable" if value == "true" => "Tiered Storage functionality is disabled in \
             the broker. Topic cannot be configured with remote log storage (a diskless topic keeps \
             its data in object storage already)."
            .to_string(),
        "diskless.enable" if value != "true" => {
            "diskless.enable=false is not supported: this broker serves diskless topics only, and \
             a topic's diskless.enable cannot change (KIP-1150)"
                .to_string()
        }
        _ => return None,
    };
    Some(ApiError::invalid_config(message))
}

/// Checks topic configs as Kafka does (known names, values of the right type and range, Kafka's
/// cross-config rule) and refuses what a diskless topic cannot honour; the canonical values and the
/// [`TopicConfig`] they make (`base` gives what is not a topic config: the producer-id expiration;
/// `defaults` the broker's defaults of what is not set).
pub(crate) fn resolve(
    base: &TopicConfig,
    defaults: &TopicDefaults,
    configs: &[(String, String)],
) -> Result<(Overrides, TopicConfig), ApiError> {
    let overrides = canonical_set(TOPIC_CONFIGS, "topic", configs)?;
    let long = |name: &str| -> i64 {
        let text = match overrides.get(name) {
            Some(v) => v.clone(),
            None => def(name).map_or_else(|| "0".to_string(), |d| default_value(d, defaults)),
        };
        text.parse().unwrap_or(0)
    };
    let int = |name: &str| i32::try_from(long(name)).unwrap_or(i32::MAX);
    let (min_lag, max_lag) = (long("min.compaction.lag.ms"), long("max.compaction.lag.ms"));
    if min_lag > max_lag {
        return Err(ApiError::invalid_config(format!(
            "conflict topic config setting min.compaction.lag.ms ({min_lag}) > \
             max.compaction.lag.ms ({max_lag})"
        )));
    }
    for (name, value) in &overrides {
        if let Some(e) = diskless_refusal(name, value) {
            return Err(e);
        }
    }
    let mut config = TopicConfig {
        producer_id_expiration_ms: base.producer_id_expiration_ms,
        ..TopicConfig::default()
    };
    config.retention_ms = long("retention.ms");
    // Kafka reads any negative retention.bytes as "no limit".
    config.retention_bytes = long("retention.bytes").max(-1);
    config.max_message_bytes = int("max.message.bytes");
    config.segment_bytes = int("segment.bytes");
    config.segment_ms = long("segment.ms");
    config.index_interval_bytes = int("index.interval.bytes");
    config.segment_index_bytes = int("segment.index.bytes");
    config.message_timestamp_before_max_ms = long("message.timestamp.before.max.ms");
    config.message_timestamp_after_max_ms = long("message.timestamp.after.max.ms");
    if overrides.get("message.timestamp.type").map(String::as_str) == Some("LogAppendTime") {
        config.timestamp_type = TimestampType::LogAppendTime;
    }
    if let Some(value) = overrides.get("compression.type") {
        // Checked against Kafka's names by canonical_set.
        config.compression_type = TopicCompression::from_name(value).unwrap_or_default();
    }
    config.compression_gzip_level = int("compression.gzip.level");
    config.compression_lz4_level = int("compression.lz4.level");
    config.compression_zstd_level = int("compression.zstd.level");
    // Compaction (issue #29): checked against Kafka's validators by canonical_set.
    if let Some(value) = overrides.get("cleanup.policy") {
        config.cleanup_policy = CleanupPolicy::from_name(value).unwrap_or_default();
    }
    config.delete_retention_ms = long("delete.retention.ms");
    config.min_compaction_lag_ms = long("min.compaction.lag.ms");
    config.max_compaction_lag_ms = long("max.compaction.lag.ms");
    let ratio = match overrides.get("min.cleanable.dirty.ratio") {
        Some(v) => v.clone(),
        None => def("min.cleanable.dirty.ratio")
            .map_or_else(|| "0.5".to_string(), |d| default_value(d, defaults)),
    };
    config.min_cleanable_dirty_ratio = ratio.parse().unwrap_or(0.5);
    Ok((overrides, config))
}

/// The value of an applied config in `config`.
fn applied_value(config: &TopicConfig, name: &str) -> Option<String> {
    Some(match name {
        "retention.ms" => config.retention_ms.to_string(),
        "retention.bytes" => config.retention_bytes.to_string(),
        "max.message.bytes" => config.max_message_bytes.to_string(),
        "message.timestamp.before.max.ms" => config.message_timestamp_before_max_ms.to_string(),
        "message.timestamp.after.max.ms" => config.message_timestamp_after_max_ms.to_string(),
        "segment.bytes" => config.segment_bytes.to_string(),
        "segment.ms" => config.segment_ms.to_string(),
        "index.interval.bytes" => config.index_interval_bytes.to_string(),
        "segment.index.bytes" => config.segment_index_bytes.to_string(),
        "message.timestamp.type" => match config.timestamp_type {
            TimestampType::CreateTime => "CreateTime".to_string(),
            TimestampType::LogAppendTime => "LogAppendTime".to_string(),
        },
        "compression.type" => config.compression_type.name().to_string(),
        "compression.gzip.level" => config.compression_gzip_level.to_string(),
        "compression.lz4.level" => config.compression_lz4_level.to_string(),
        "compression.zstd.level" => config.compression_zstd_level.to_string(),
        "cleanup.policy"
        | "delete.retention.ms"
        | "min.compaction.lag.ms"
        | "max.compaction.lag.ms"
        | "min.cleanable.dirty.ratio" => config.kafka_config_value(name)?,
        _ => return None,
    })
}

/// The configs set on a topic: those kept by this process, with the applied ones as the
/// coordinator has them (an applied config that differs from this broker's default counts as set,
/// also when it was set by another process or before a restart — or when the topic was created
/// while `--segment-ms` / `--segment-bytes` had other values).
pub(crate) fn current_overrides(
    config: &TopicConfig,
    kept: &Overrides,
    defaults: &TopicDefaults,
) -> Overrides {
    let mut out = kept.clone();
    for d in TOPIC_CONFIGS.iter().filter(|d| d.effect == Effect::Applied) {
        let Some(value) = applied_value(config, d.name) else {
            continue;
        };
        if value != default_value(d, defaults) || kept.contains_key(d.name) {
            out.insert(d.name.to_string(), value);
        }
    }
    out
}

/// One described config.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub name: &'static str,
    pub value: String,
    pub source: i8,
    kind: Kind,
    /// (name, value, source), most significant first.
    synonyms: Vec<(&'static str, String, i8)>,
    doc: String,
}

/// Every topic config of a topic whose set configs are `overrides` (Kafka's `createTopicConfigEntry`),
/// by name; only `keys` when given. A config's source is its first synonym's, as in Kafka: the
/// topic's, else the broker's static setting, else the default.
pub(crate) fn topic_entries(
    overrides: &Overrides,
    defaults: &TopicDefaults,
    keys: Option<&BTreeSet<String>>,
) -> Vec<Entry> {
    TOPIC_CONFIGS
        .iter()
        .filter(|d| keys.is_none_or(|k| k.contains(d.name)))
        .map(|d| {
            let set = overrides.get(d.name);
            let mut synonyms = Vec::new();
            if let Some(v) = set {
                synonyms.push((d.name, v.clone(), SOURCE_TOPIC));
            }
            if let Some((broker_name, value)) = static_broker(d.name, defaults) {
                synonyms.push((broker_name, value, SOURCE_STATIC_BROKER));
            }
            if let Some((broker_name, broker_default)) = d.broker {
                synonyms.push((broker_name, broker_default.to_string(), SOURCE_DEFAULT));
            }
            let doc = match (d.effect, d.name) {
                (
                    Effect::Applied,
                    "segment.bytes" | "segment.ms" | "index.interval.bytes" | "segment.index.bytes",
                ) => {
                    "Kafka's topic config; applied to the tiered segments this diskless topic's \
                     batches are consolidated into."
                }
                (Effect::Applied, "cleanup.policy") => {
                    "Kafka's topic config; delete and compact both apply: compaction rewrites this \
                     diskless topic's tiered segments (issue #29)."
                }
                (Effect::Applied, _) => "Kafka's topic config; applied to this diskless topic.",
                (_, "diskless.enable") => "KIP-1150: the topic is diskless (always true here).",
                _ => "Kafka's topic config; accepted and kept, no effect on a diskless topic.",
            };
            Entry {
                name: d.name,
                value: set.cloned().unwrap_or_else(|| default_value(d, defaults)),
                source: synonyms.first().map_or(SOURCE_DEFAULT, |s| s.2),
                kind: d.kind,
                synonyms,
                doc: doc.to_string(),
            }
        })
        .collect()
}

/// The configs of this broker (node `node`), all read-only: set on the command line.
fn broker_entries(broker: &Broker, node: i32) -> Vec<Entry> {
    let defaults = broker.topics.defaults();
    let mut entries: Vec<Entry> = Vec::new();
    let mut add = |name: &'static str, value: String, kind: Kind, source: i8| {
        entries.push(Entry {
            name,
            value: value.clone(),
            source,
            kind,
            synonyms: vec![(name, value, source)],
            doc: "Read-only: set on the example broker's command line.".to_string(),
        });
    };
    let static_or_default = |is_default: bool| {
        if is_default {
            SOURCE_DEFAULT
        } else {
            SOURCE_STATIC_BROKER
        }
    };
    let me = broker.cluster.nodes.iter().find(|n| n.id == node);
    add("node.id", node.to_string(), Kind::Int, SOURCE_STATIC_BROKER);
    add(
        "broker.id",
        node.to_string(),
        Kind::Int,
        SOURCE_STATIC_BROKER,
    );
    if let Some(me) = me {
        let listener = format!("PLAINTEXT://{}:{}", me.host, me.port);
        add(
            "advertised.listeners",
            listener.clone(),
            Kind::String,
            SOURCE_STATIC_BROKER,
        );
        add("listeners", listener, Kind::String, SOURCE_STATIC_BROKER);
        add(
            "broker.rack",
            me.rack.clone(),
            Kind::String,
            SOURCE_STATIC_BROKER,
        );
    }
    add(
        "auto.create.topics.enable",
        defaults.auto_create.to_string(),
        Kind::Boolean,
        static_or_default(!defaults.auto_create),
    );
    add(
        "num.partitions",
        defaults.num_partitions.to_string(),
        Kind::Int,
        static_or_default(defaults.num_partitions == 1),
    );
    add(
        "log.retention.hours",
        "168".into(),
        Kind::Int,
        SOURCE_DEFAULT,
    );
    // The broker configs set on the command line (`--segment-ms`, `--segment-bytes`): static,
    // then Kafka's default of the same setting (log.roll.ms: log.roll.hours) as Kafka lists them.
    for d in TOPIC_CONFIGS {
        if let Some((name, value)) = static_broker(d.name, &defaults) {
            let mut synonyms = vec![(name, value.clone(), SOURCE_STATIC_BROKER)];
            if let Some((default_name, default)) = d.broker {
                synonyms.push((default_name, default.to_string(), SOURCE_DEFAULT));
            }
            entries.push(Entry {
                name,
                value,
                source: SOURCE_STATIC_BROKER,
                kind: d.kind,
                synonyms,
                doc: "Read-only: set on the example broker's command line.".to_string(),
            });
        }
    }
    let mut add = |name: &'static str, value: String, kind: Kind, source: i8| {
        entries.push(Entry {
            name,
            value: value.clone(),
            source,
            kind,
            synonyms: vec![(name, value, source)],
            doc: "Read-only: set on the example broker's command line.".to_string(),
        });
    };
    for d in TOPIC_CONFIGS {
        if let Some((name, value)) = d.broker {
            let kind = match name {
                "log.cleanup.policy" => Kind::List,
                "log.roll.hours" => Kind::Int,
                _ => d.kind,
            };
            add(name, value.to_string(), kind, SOURCE_DEFAULT);
        }
    }
    // Sorted by name; of two entries of one name (set, and Kafka's default) the first (set) stays.
    entries.sort_by(|a, b| a.name.cmp(b.name));
    entries.dedup_by(|a, b| a.name == b.name);
    entries
}

fn str(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

fn describe_entry(
    ctx: &Ctx,
    e: &Entry,
    read_only: bool,
    synonyms: bool,
    docs: bool,
) -> DescribeConfigsResourceResult {
    let mut r = DescribeConfigsResourceResult::default();
    r.name = str(e.name);
    r.value = Some(str(&e.value));
    r.read_only = read_only;
    r.config_source = e.source;
    r.is_sensitive = false;
    if synonyms {
        r.synonyms = e
            .synonyms
            .iter()
            .map(|(name, value, source)| {
                let mut s = DescribeConfigsSynonym::default();
                s.name = str(name);
                s.value = Some(str(value));
                s.source = *source;
                s
            })
            .collect();
    }
    if ctx.version >= 3 {
        r.config_type = e.kind.id();
        if docs {
            r.documentation = Some(str(&e.doc));
        }
    }
    r
}

/// Kafka's `Topic.validate`: why `name` is not a legal topic name, if it is not.
pub(crate) fn invalid_topic_name(name: &str) -> Option<String> {
    if diskless_coordinator::is_valid_topic_name(name) {
        return None;
    }
    let reason = if name.is_empty() {
        "the empty string is not allowed".to_string()
    } else if name == "." {
        "'.' is not allowed".to_string()
    } else if name == ".." {
        "'..' is not allowed".to_string()
    } else if name.len() > 249 {
        format!("the length of '{name}' is longer than the max allowed length 249")
    } else if !name
        .bytes()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
    {
        format!(
            "'{name}' contains one or more characters other than ASCII alphanumerics, '.', '_' and '-'"
        )
    } else {
        format!("'{name}' is not a legal topic name")
    };
    Some(format!("Topic name is invalid: {reason}"))
}

fn broker_id(name: &str) -> Result<i32, ApiError> {
    name.parse().map_err(|_| {
        ApiError::new(
            codes::INVALID_REQUEST,
            format!("Broker id must be an integer, but it is: {name}"),
        )
    })
}

/// DescribeConfigs (versions 1-4): topics, groups, this broker, and its loggers (none).
pub(crate) async fn describe_configs(
    broker: &Arc<Broker>,
    ctx: &Ctx,
    request: DescribeConfigsRequest,
) -> DescribeConfigsResponse {
    let mut response = DescribeConfigsResponse::default();
    for resource in request.resources {
        let name = resource.resource_name.as_str().to_string();
        let keys: Option<BTreeSet<String>> = resource
            .configuration_keys
            .as_ref()
            .filter(|k| !k.is_empty())
            .map(|k| k.iter().map(|s| s.as_str().to_string()).collect());
        let mut result = DescribeConfigsResult::default();
        result.resource_type = resource.resource_type;
        result.resource_name = resource.resource_name.clone();
        let outcome: Result<(Vec<Entry>, bool), ApiError> = match resource.resource_type {
            RESOURCE_TOPIC => match invalid_topic_name(&name) {
                Some(why) => Err(ApiError::new(codes::INVALID_TOPIC_EXCEPTION, why)),
                None => match broker.topics.by_name(&name).await {
                    Ok(Some(topic)) => topic_overrides(broker, &topic).await.map(|overrides| {
                        let defaults = broker.topics.defaults();
                        (topic_entries(&overrides, &defaults, keys.as_ref()), false)
                    }),
                    Ok(None) => Err(ApiError::new(codes::UNKNOWN_TOPIC_OR_PARTITION, "")),
                    Err(e) => Err(ApiError::new(e.error_code().code(), e.to_string())),
                },
            },
            RESOURCE_GROUP if name.is_empty() => Err(empty_group_name()),
            RESOURCE_GROUP => broker
                .store
                .group_configs(&name)
                .await
                .map_err(store_error)
                .map(|set| (group_entries(&set, keys.as_ref()), false)),
            RESOURCE_BROKER if name.is_empty() => Ok((Vec::new(), true)),
            RESOURCE_BROKER => match broker_id(&name) {
                Ok(id) if id == ctx.node => {
                    let all = broker_entries(broker, id);
                    Ok((
                        all.into_iter()
                            .filter(|e| keys.as_ref().is_none_or(|k| k.contains(e.name)))
                            .collect(),
                        true,
                    ))
                }
                Ok(_) => Err(ApiError::new(
                    codes::INVALID_REQUEST,
                    format!(
                        "Unexpected broker id, expected {} or empty string, but received {name}",
                        ctx.node
                    ),
                )),
                Err(e) => Err(e),
            },
            RESOURCE_BROKER_LOGGER => match broker_id(&name) {
                _ if name.is_empty() => Err(ApiError::new(
                    codes::INVALID_REQUEST,
                    "Broker id must not be empty",
                )),
                Ok(id) if id == ctx.node => Ok((Vec::new(), false)),
                Ok(_) => Err(ApiError::new(
                    codes::INVALID_REQUEST,
                    format!(
                        "Unexpected broker id, expected {} but received {name}",
                        ctx.node
                    ),
                )),
                Err(e) => Err(e),
            },
            other => Err(ApiError::new(
                codes::INVALID_REQUEST,
                format!("Unsupported resource type: {other}"),
            )),
        };
        match outcome {
            Ok((entries, read_only)) => {
                result.configs = entries
                    .iter()
                    .map(|e| {
                        describe_entry(
                            ctx,
                            e,
                            read_only,
                            request.include_synonyms,
                            request.include_documentation,
                        )
                    })
                    .collect();
            }
            Err(e) => {
                result.error_code = e.code;
                if !e.message.is_empty() {
                    result.error_message = Some(StrBytes::from_string(e.message));
                }
            }
        }
        response.results.push(result);
    }
    response
}

/// The configs set on `topic` (see [`current_overrides`]).
pub(crate) async fn topic_overrides(broker: &Broker, topic: &Topic) -> Result<Overrides, ApiError> {
    let kept = broker
        .topics
        .overrides(topic.id)
        .await
        .map_err(store_error)?;
    Ok(current_overrides(
        &topic.config,
        &kept,
        &broker.topics.defaults(),
    ))
}

/// A failure of the broker's own store, as Kafka reports a storage failure.
pub(crate) fn store_error(e: crate::store::StoreError) -> ApiError {
    ApiError::new(codes::KAFKA_STORAGE_ERROR, e.to_string())
}

/// One resource of an alter request.
struct AlterResource {
    resource_type: i8,
    name: String,
    /// (name, operation, value).
    ops: Vec<(String, i8, Option<String>)>,
}

/// The split of a list config's value (Kafka's `getParts`: a missing value is the default's list).
fn parts(value: Option<&String>, d: &Def) -> Vec<String> {
    value
        .map(String::as_str)
        .unwrap_or(d.default)
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// Applies incremental operations to the configs set on a topic.
fn apply_ops(
    mut overrides: Overrides,
    ops: &[(String, i8, Option<String>)],
) -> Result<Overrides, ApiError> {
    for (name, op, value) in ops {
        match *op {
            OP_SET => {
                overrides.insert(name.clone(), value.clone().unwrap_or_default());
            }
            OP_DELETE => {
                overrides.remove(name);
            }
            OP_APPEND | OP_SUBTRACT => {
                let opname = if *op == OP_APPEND {
                    "APPEND"
                } else {
                    "SUBTRACT"
                };
                let Some(d) = def(name).filter(|d| d.kind == Kind::List) else {
                    return Err(ApiError::invalid_config(format!(
                        "Can't {opname} to key {name} because its type is not LIST."
                    )));
                };
                let mut list = parts(overrides.get(name), d);
                for v in value.as_deref().unwrap_or("").split(',') {
                    if *op == OP_APPEND {
                        if !list.iter().any(|x| x == v) {
                            list.push(v.to_string());
                        }
                    } else if let Some(i) = list.iter().position(|x| x == v) {
                        list.remove(i);
                    }
                }
                overrides.insert(name.clone(), list.join(","));
            }
            other => {
                return Err(ApiError::new(
                    codes::INVALID_REQUEST,
                    format!("Unknown operation type {other}"),
                ));
            }
        }
    }
    Ok(overrides)
}

/// Kafka's request checks before any resource is altered: each resource at most once, no
/// duplicate keys, no null value except for a delete.
fn preprocess(resources: &[AlterResource]) -> Vec<Option<ApiError>> {
    resources
        .iter()
        .map(|r| {
            let same = resources
                .iter()
                .filter(|o| o.resource_type == r.resource_type && o.name == r.name)
                .count();
            if same > 1 {
                return Some(ApiError::new(
                    codes::INVALID_REQUEST,
                    "Each resource must appear at most once.",
                ));
            }
            let mut seen = BTreeSet::new();
            if !r.ops.iter().all(|(n, _, _)| seen.insert(n.as_str())) {
                return Some(ApiError::new(
                    codes::INVALID_REQUEST,
                    "Error due to duplicate config keys",
                ));
            }
            let nulls: Vec<&str> = r
                .ops
                .iter()
                .filter(|(_, op, v)| *op != OP_DELETE && v.is_none())
                .map(|(n, _, _)| n.as_str())
                .collect();
            if !nulls.is_empty() {
                return Some(ApiError::new(
                    codes::INVALID_REQUEST,
                    format!("Null value not supported for : {}", nulls.join(", ")),
                ));
            }
            None
        })
        .collect()
}

/// Alters one resource: `incremental` applies the operations to what is set, otherwise (legacy
/// AlterConfigs) the given configs replace everything set.
async fn alter_resource(
    broker: &Arc<Broker>,
    ctx: &Ctx,
    resource: &AlterResource,
    incremental: bool,
    validate_only: bool,
) -> Result<(), ApiError> {
    let name = resource.name.as_str();
    match resource.resource_type {
        RESOURCE_TOPIC => {}
        RESOURCE_GROUP => return alter_group(broker, resource, incremental, validate_only).await,
        RESOURCE_BROKER | RESOURCE_BROKER_LOGGER => {
            if !name.is_empty() && broker_id(name)? != ctx.node {
                return Err(ApiError::new(
                    codes::INVALID_REQUEST,
                    format!(
                        "Unexpected broker id, expected {}, but received {name}",
                        ctx.node
                    ),
                ));
            }
            let keys: Vec<&str> = resource.ops.iter().map(|(n, _, _)| n.as_str()).collect();
            return Err(ApiError::new(
                codes::INVALID_REQUEST,
                format!(
                    "Cannot update these configs dynamically: {} (the example broker's configs are \
                     set on its command line)",
                    keys.join(", ")
                ),
            ));
        }
        other => {
            return Err(ApiError::new(
                codes::INVALID_REQUEST,
                format!("Unknown resource type {other}"),
            ));
        }
    }
    if name.is_empty() {
        return Err(ApiError::new(
            codes::INVALID_REQUEST,
            "Default topic resources are not allowed.",
        ));
    }
    if let Some(why) = invalid_topic_name(name) {
        return Err(ApiError::new(codes::INVALID_TOPIC_EXCEPTION, why));
    }
    let topic = broker
        .topics
        .by_name(name)
        .await
        .map_err(|e| ApiError::new(e.error_code().code(), e.to_string()))?;
    let current = match &topic {
        Some(t) => topic_overrides(broker, t).await?,
        None => Overrides::default(),
    };
    let wanted = if incremental {
        apply_ops(current, &resource.ops)?
    } else {
        resource
            .ops
            .iter()
            .map(|(n, _, v)| (n.clone(), v.clone().unwrap_or_default()))
            .collect()
    };
    let wanted: Vec<(String, String)> = wanted.into_iter().collect();
    let base = topic
        .as_ref()
        .map(|t| (*t.config).clone())
        .unwrap_or_default();
    let (overrides, config) = resolve(&base, &broker.topics.defaults(), &wanted)?;
    let Some(topic) = topic else {
        return Err(ApiError::new(
            codes::UNKNOWN_TOPIC_OR_PARTITION,
            format!("The topic '{name}' does not exist."),
        ));
    };
    if validate_only {
        return Ok(());
    }
    if config != *topic.config {
        persist_topic_config(broker, &topic, config).await?;
    }
    broker
        .topics
        .set_overrides(topic.id, overrides.clone())
        .await
        .map_err(store_error)?;
    broker.topics.invalidate();
    info!(topic = %topic.name, ?overrides, "topic configs altered");
    Ok(())
}

/// Alters the configs set on a group (the group need not exist, as in Kafka).
async fn alter_group(
    broker: &Arc<Broker>,
    resource: &AlterResource,
    incremental: bool,
    validate_only: bool,
) -> Result<(), ApiError> {
    let name = resource.name.as_str();
    if name.is_empty() {
        return Err(empty_group_name());
    }
    let wanted = if incremental {
        let current = broker
            .store
            .group_configs(name)
            .await
            .map_err(store_error)?;
        apply_ops(current, &resource.ops)?
    } else {
        resource
            .ops
            .iter()
            .map(|(n, _, v)| (n.clone(), v.clone().unwrap_or_default()))
            .collect()
    };
    let wanted: Vec<(String, String)> = wanted.into_iter().collect();
    let set = resolve_group(&wanted)?;
    if validate_only {
        return Ok(());
    }
    broker
        .store
        .set_group_configs(name, &set)
        .await
        .map_err(store_error)?;
    info!(group = %name, configs = ?set, "group configs altered");
    Ok(())
}

/// Stores a changed [`TopicConfig`] in the coordinator.
async fn persist_topic_config(
    broker: &Arc<Broker>,
    topic: &Topic,
    config: TopicConfig,
) -> Result<(), ApiError> {
    broker
        .coordinator
        .alter_topic_config(topic.id, config)
        .await
        .map_err(|e| match e {
            diskless_coordinator::CoordinatorError::UnknownTopic(_) => ApiError::new(
                codes::UNKNOWN_TOPIC_OR_PARTITION,
                format!("The topic '{}' does not exist.", topic.name),
            ),
            other => ApiError::new(other.error_code().code(), other.to_string()),
        })
}

/// IncrementalAlterConfigs (versions 0-1): topic configs change at run time.
pub(crate) async fn incremental_alter_configs(
    broker: &Arc<Broker>,
    ctx: &Ctx,
    request: IncrementalAlterConfigsRequest,
) -> IncrementalAlterConfigsResponse {
    let resources: Vec<AlterResource> = request
        .resources
        .iter()
        .map(|r| AlterResource {
            resource_type: r.resource_type,
            name: r.resource_name.as_str().to_string(),
            ops: r
                .configs
                .iter()
                .map(|c| {
                    (
                        c.name.as_str().to_string(),
                        c.config_operation,
                        c.value.as_ref().map(|v| v.as_str().to_string()),
                    )
                })
                .collect(),
        })
        .collect();
    let pre = preprocess(&resources);
    let mut response = IncrementalAlterConfigsResponse::default();
    for (resource, pre) in resources.iter().zip(pre) {
        let outcome = match pre {
            Some(e) => Err(e),
            None => alter_resource(broker, ctx, resource, true, request.validate_only).await,
        };
        let mut r = IncrementalResult::default();
        r.resource_type = resource.resource_type;
        r.resource_name = StrBytes::from_string(resource.name.clone());
        if let Err(e) = outcome {
            info!(resource = %resource.name, code = e.code, "IncrementalAlterConfigs refused: {}", e.message);
            r.error_code = e.code;
            r.error_message = Some(StrBytes::from_string(e.message));
        }
        response.responses.push(r);
    }
    response
}

/// AlterConfigs (versions 0-2, the legacy API): the given configs replace the topic's set configs.
pub(crate) async fn alter_configs(
    broker: &Arc<Broker>,
    ctx: &Ctx,
    request: AlterConfigsRequest,
) -> AlterConfigsResponse {
    let resources: Vec<AlterResource> = request
        .resources
        .iter()
        .map(|r| AlterResource {
            resource_type: r.resource_type,
            name: r.resource_name.as_str().to_string(),
            ops: r
                .configs
                .iter()
                .map(|c| {
                    (
                        c.name.as_str().to_string(),
                        OP_SET,
                        c.value.as_ref().map(|v| v.as_str().to_string()),
                    )
                })
                .collect(),
        })
        .collect();
    let pre = preprocess(&resources);
    let mut response = AlterConfigsResponse::default();
    for (resource, pre) in resources.iter().zip(pre) {
        let outcome = match pre {
            Some(e) => Err(e),
            None => alter_resource(broker, ctx, resource, false, request.validate_only).await,
        };
        let mut r =
            kafka_protocol::messages::alter_configs_response::AlterConfigsResourceResponse::default(
            );
        r.resource_type = resource.resource_type;
        r.resource_name = StrBytes::from_string(resource.name.clone());
        if let Err(e) = outcome {
            info!(resource = %resource.name, code = e.code, "AlterConfigs refused: {}", e.message);
            r.error_code = e.code;
            r.error_message = Some(StrBytes::from_string(e.message));
        }
        response.responses.push(r);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn configs(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn table_is_sorted_and_defaults_are_valid_and_match_the_coordinator() {
        for w in TOPIC_CONFIGS.windows(2) {
            assert!(w[0].name < w[1].name, "{} before {}", w[0].name, w[1].name);
        }
        for d in TOPIC_CONFIGS {
            assert_eq!(canonical(d, d.default).unwrap(), d.default, "{}", d.name);
        }
        let defaults = TopicConfig::default();
        for d in TOPIC_CONFIGS.iter().filter(|d| d.effect == Effect::Applied) {
            assert_eq!(
                applied_value(&defaults, d.name).unwrap(),
                d.default,
                "{}",
                d.name
            );
        }
        let broker = TopicDefaults::default();
        let (overrides, config) = resolve(&defaults, &broker, &[]).unwrap();
        assert!(overrides.is_empty());
        assert_eq!(config, broker.topic_config());
        assert_eq!(
            (config.segment_ms, config.segment_bytes),
            (600_000, 256 << 20),
            "the broker's own segment defaults"
        );
        // What a new topic gets is not described as set.
        assert!(current_overrides(&config, &Overrides::new(), &broker).is_empty());
    }

    #[test]
    fn applied_configs_reach_the_topic_config() {
        let (overrides, c) = resolve(
            &TopicConfig::default(),
            &TopicDefaults::default(),
            &configs(&[
                ("retention.ms", "1000"),
                ("retention.bytes", "-5"),
                ("max.message.bytes", " 2048 "),
                ("message.timestamp.type", "LogAppendTime"),
                ("message.timestamp.after.max.ms", "10"),
                ("segment.bytes", "1048576"),
                ("cleanup.policy", "delete"),
                ("unclean.leader.election.enable", "TRUE"),
                ("min.cleanable.dirty.ratio", "1"),
            ]),
        )
        .unwrap();
        assert_eq!(c.retention_ms, 1000);
        assert_eq!(c.retention_bytes, -1);
        assert_eq!(c.max_message_bytes, 2048);
        assert_eq!(c.timestamp_type, TimestampType::LogAppendTime);
        assert_eq!(c.message_timestamp_after_max_ms, 10);
        assert_eq!(overrides["max.message.bytes"], "2048");
        assert_eq!(overrides["unclean.leader.election.enable"], "true");
        assert_eq!(overrides["min.cleanable.dirty.ratio"], "1.0");
        assert_eq!(overrides["segment.bytes"], "1048576");
        assert_eq!(c.segment_bytes, 1 << 20);
    }

    #[test]
    fn segment_configs_take_effect_with_kafkas_bounds() {
        let broker = TopicDefaults {
            segment_ms: 2000,
            segment_bytes: 2 << 20,
            ..TopicDefaults::default()
        };
        let (overrides, c) = resolve(
            &TopicConfig::default(),
            &broker,
            &configs(&[
                ("segment.ms", "1"),
                ("segment.bytes", "1048576"),
                ("index.interval.bytes", "0"),
                ("segment.index.bytes", "4"),
                ("segment.jitter.ms", "5"),
            ]),
        )
        .unwrap();
        assert_eq!(
            (
                c.segment_ms,
                c.segment_bytes,
                c.index_interval_bytes,
                c.segment_index_bytes
            ),
            (1, 1 << 20, 0, 4)
        );
        assert_eq!(overrides.len(), 5);
        // Unset: the broker's --segment-ms / --segment-bytes, Kafka's index defaults.
        let (_, c) = resolve(&TopicConfig::default(), &broker, &[]).unwrap();
        assert_eq!(
            (
                c.segment_ms,
                c.segment_bytes,
                c.index_interval_bytes,
                c.segment_index_bytes
            ),
            (2000, 2 << 20, 4096, 10 << 20)
        );
        // A topic set to Kafka's own default differs from this broker's: described as set.
        let kafka = TopicConfig::default();
        let set = current_overrides(&kafka, &Overrides::new(), &broker);
        assert_eq!(
            set.keys().map(String::as_str).collect::<Vec<_>>(),
            ["segment.bytes", "segment.ms"]
        );
        for (name, value, says) in [
            ("segment.bytes", "1048575", "Value must be at least 1048576"),
            ("segment.bytes", "14", "Value must be at least 1048576"),
            ("segment.bytes", "2147483648", "Not a number of type INT"),
            ("segment.ms", "0", "Value must be at least 1"),
            ("segment.ms", "1.5", "Not a number of type LONG"),
            ("index.interval.bytes", "-1", "Value must be at least 0"),
            ("segment.index.bytes", "3", "Value must be at least 4"),
        ] {
            let e =
                resolve(&TopicConfig::default(), &broker, &configs(&[(name, value)])).unwrap_err();
            assert_eq!(e.code, codes::INVALID_CONFIG, "{name}={value}");
            assert!(e.message.contains(says), "{name}={value}: {}", e.message);
        }
    }

    #[test]
    fn segment_defaults_are_described_as_static_broker_configs() {
        let broker = TopicDefaults {
            segment_ms: 2000,
            ..TopicDefaults::default()
        };
        let entries = topic_entries(&Overrides::new(), &broker, None);
        let get = |n: &str| entries.iter().find(|e| e.name == n).unwrap();
        let ms = get("segment.ms");
        assert_eq!(
            (ms.value.as_str(), ms.source),
            ("2000", SOURCE_STATIC_BROKER)
        );
        assert_eq!(
            ms.synonyms,
            vec![
                ("log.roll.ms", "2000".to_string(), SOURCE_STATIC_BROKER),
                ("log.roll.hours", "168".to_string(), SOURCE_DEFAULT),
            ]
        );
        let bytes = get("segment.bytes");
        assert_eq!(
            (bytes.value.as_str(), bytes.source),
            ("268435456", SOURCE_STATIC_BROKER)
        );
        assert_eq!(
            bytes.synonyms,
            vec![
                (
                    "log.segment.bytes",
                    "268435456".to_string(),
                    SOURCE_STATIC_BROKER
                ),
                (
                    "log.segment.bytes",
                    "1073741824".to_string(),
                    SOURCE_DEFAULT
                ),
            ]
        );
        let interval = get("index.interval.bytes");
        assert_eq!(
            (interval.value.as_str(), interval.source),
            ("4096", SOURCE_DEFAULT)
        );
        // Set on the topic: the topic's value first, then the broker's.
        let set: Overrides = [("segment.ms".to_string(), "5".to_string())].into();
        let entries = topic_entries(&set, &broker, None);
        let ms = entries.iter().find(|e| e.name == "segment.ms").unwrap();
        assert_eq!((ms.value.as_str(), ms.source), ("5", SOURCE_TOPIC));
        assert_eq!(ms.synonyms.len(), 3);
        assert_eq!(ms.synonyms[1].2, SOURCE_STATIC_BROKER);
    }

    #[test]
    fn compression_configs_are_applied_and_described_back() {
        let (overrides, config) = resolve(
            &TopicConfig::default(),
            &TopicDefaults::default(),
            &configs(&[
                ("compression.type", "zstd"),
                ("compression.zstd.level", "7"),
                ("compression.gzip.level", "9"),
            ]),
        )
        .unwrap();
        assert_eq!(config.compression_type, TopicCompression::Zstd);
        assert_eq!(
            (
                config.compression_zstd_level,
                config.compression_gzip_level,
                config.compression_lz4_level
            ),
            (7, 9, 9)
        );
        assert_eq!(overrides["compression.type"], "zstd");
        // Described back from the coordinator's TopicConfig, also by a process that did not set it.
        let described = current_overrides(&config, &Overrides::new(), &TopicDefaults::default());
        assert_eq!(described["compression.type"], "zstd");
        assert_eq!(described["compression.zstd.level"], "7");
        assert!(
            !described.contains_key("compression.lz4.level"),
            "{described:?}"
        );
        let (_, default) =
            resolve(&TopicConfig::default(), &TopicDefaults::default(), &[]).unwrap();
        assert_eq!(default.compression_type, TopicCompression::Producer);
    }

    #[test]
    fn bad_and_unsupported_configs_are_refused_with_invalid_config() {
        for (name, value, says) in [
            (
                "unknown.config",
                "1",
                "Unknown topic config name: unknown.config",
            ),
            ("retention.ms", "-2", "Value must be at least -1"),
            ("max.message.bytes", "x", "Not a number of type INT"),
            (
                "max.message.bytes",
                "3000000000",
                "Not a number of type INT",
            ),
            ("message.timestamp.type", "Now", "String must be one of"),
            ("cleanup.policy", "shrink", "String must be one of"),
            ("compression.type", "brotli", "String must be one of"),
            ("compression.gzip.level", "0", "between 1 and 9"),
            ("remote.storage.enable", "true", "Tiered Storage"),
            ("diskless.enable", "false", "diskless topics only"),
            ("preallocate", "yes", "either true or false"),
            ("min.cleanable.dirty.ratio", "1.5", "between 0 and 1"),
            (
                "leader.replication.throttled.replicas",
                "x",
                "[partitionId]:[brokerId]",
            ),
        ] {
            let e = resolve(
                &TopicConfig::default(),
                &TopicDefaults::default(),
                &configs(&[(name, value)]),
            )
            .unwrap_err();
            assert_eq!(e.code, codes::INVALID_CONFIG, "{name}={value}");
            assert!(e.message.contains(says), "{name}={value}: {}", e.message);
        }
        let e = resolve(
            &TopicConfig::default(),
            &TopicDefaults::default(),
            &configs(&[
                ("min.compaction.lag.ms", "10"),
                ("max.compaction.lag.ms", "5"),
            ]),
        )
        .unwrap_err();
        assert!(e.message.contains("conflict topic config"), "{}", e.message);
        // Accepted: Kafka's values that change nothing on a diskless topic.
        for (name, value) in [
            ("leader.replication.throttled.replicas", "0:1,1:2"),
            ("follower.replication.throttled.replicas", "*"),
            ("compression.type", "producer"),
            ("compression.gzip.level", "-1"),
            ("local.retention.ms", "-2"),
            ("diskless.enable", "true"),
        ] {
            assert!(
                resolve(
                    &TopicConfig::default(),
                    &TopicDefaults::default(),
                    &configs(&[(name, value)]),
                )
                .is_ok(),
                "{name}={value}"
            );
        }
    }

    #[test]
    fn group_configs_follow_kafkas_group_config_rules() {
        let set = resolve_group(&configs(&[
            ("consumer.session.timeout.ms", " 50000"),
            ("share.auto.offset.reset", "earliest"),
        ]))
        .unwrap();
        assert_eq!(set["consumer.session.timeout.ms"], "50000");
        assert_eq!(set["share.auto.offset.reset"], "earliest");
        for (pairs, why) in [
            (
                &[("consumer.session.timeout.ms", "44999")][..],
                "greater than or equal to group.consumer.min.session.timeout.ms",
            ),
            (
                &[("consumer.session.timeout.ms", "60001")][..],
                "less than or equal to group.consumer.max.session.timeout.ms",
            ),
            (
                &[("consumer.heartbeat.interval.ms", "4999")][..],
                "group.consumer.min.heartbeat.interval.ms",
            ),
            (
                &[("share.record.lock.duration.ms", "999")][..],
                "at least 1000",
            ),
            (
                &[("share.record.lock.duration.ms", "14999")][..],
                "group.share.min.record.lock.duration.ms",
            ),
            (
                &[("share.auto.offset.reset", "none")][..],
                "String must be one of",
            ),
            (&[("consumer.session.timeout.ms", "x")][..], "INT"),
            (
                &[("retention.ms", "1")][..],
                "Unknown group config name: retention.ms",
            ),
        ] {
            let e = resolve_group(&configs(pairs)).unwrap_err();
            assert_eq!(e.code, codes::INVALID_CONFIG, "{pairs:?}");
            assert!(e.message.contains(why), "{pairs:?}: {}", e.message);
        }
        // (Kafka's "session timeout above heartbeat interval" rule cannot fail within the broker's
        // default bounds — sessions start at 45 s, heartbeats end at 15 s — so it is not exercised.)
        let described = group_entries(&set, None);
        let e = described
            .iter()
            .find(|e| e.name == "consumer.session.timeout.ms")
            .unwrap();
        assert_eq!((e.value.as_str(), e.source), ("50000", SOURCE_GROUP));
        assert_eq!(
            e.synonyms[1],
            (
                "group.consumer.session.timeout.ms",
                "45000".to_string(),
                SOURCE_DEFAULT
            )
        );
        let e = described
            .iter()
            .find(|e| e.name == "share.heartbeat.interval.ms")
            .unwrap();
        assert_eq!((e.value.as_str(), e.source), ("5000", SOURCE_DEFAULT));
        let e = described
            .iter()
            .find(|e| e.name == "share.auto.offset.reset")
            .unwrap();
        assert_eq!(
            e.synonyms.len(),
            2,
            "set, then its own default: no broker synonym"
        );
    }

    #[test]
    fn incremental_operations() {
        let start: Overrides = [("retention.ms".to_string(), "10".to_string())].into();
        let ops = vec![
            ("retention.ms".to_string(), OP_DELETE, None),
            (
                "max.message.bytes".to_string(),
                OP_SET,
                Some("100".to_string()),
            ),
            (
                "leader.replication.throttled.replicas".to_string(),
                OP_APPEND,
                Some("0:1,1:1".into()),
            ),
        ];
        let out = apply_ops(start, &ops).unwrap();
        assert!(!out.contains_key("retention.ms"));
        assert_eq!(out["max.message.bytes"], "100");
        assert_eq!(out["leader.replication.throttled.replicas"], "0:1,1:1");
        let out = apply_ops(
            out,
            &[(
                "leader.replication.throttled.replicas".to_string(),
                OP_SUBTRACT,
                Some("0:1".into()),
            )],
        )
        .unwrap();
        assert_eq!(out["leader.replication.throttled.replicas"], "1:1");
        // APPEND to cleanup.policy starts from its default (delete).
        let out = apply_ops(
            Overrides::new(),
            &[(
                "cleanup.policy".to_string(),
                OP_APPEND,
                Some("compact".into()),
            )],
        )
        .unwrap();
        assert_eq!(out["cleanup.policy"], "delete,compact");
        let e = apply_ops(
            Overrides::new(),
            &[("retention.ms".to_string(), OP_APPEND, Some("1".into()))],
        )
        .unwrap_err();
        assert_eq!(e.code, codes::INVALID_CONFIG);
        assert_eq!(
            e.message,
            "Can't APPEND to key retention.ms because its type is not LIST."
        );
    }

    #[test]
    fn preprocessing_refuses_duplicates_and_nulls() {
        let r = |name: &str, ops: Vec<(String, i8, Option<String>)>| AlterResource {
            resource_type: RESOURCE_TOPIC,
            name: name.to_string(),
            ops,
        };
        let out = preprocess(&[
            r("a", vec![]),
            r("a", vec![]),
            r(
                "b",
                vec![
                    ("x".into(), OP_SET, Some("1".into())),
                    ("x".into(), OP_SET, Some("2".into())),
                ],
            ),
            r("c", vec![("x".into(), OP_SET, None)]),
            r("d", vec![("x".into(), OP_DELETE, None)]),
        ]);
        let codes: Vec<Option<i16>> = out.iter().map(|e| e.as_ref().map(|e| e.code)).collect();
        let ir = Some(codes::INVALID_REQUEST);
        assert_eq!(codes, vec![ir, ir, ir, ir, None]);
    }

    #[test]
    fn described_sources_and_synonyms() {
        let broker = TopicDefaults::default();
        let set = current_overrides(
            // segment.bytes is applied: the coordinator has what was set.
            &TopicConfig {
                retention_ms: 5,
                segment_bytes: 1 << 20,
                ..broker.topic_config()
            },
            &[("segment.bytes".to_string(), "1048576".to_string())].into(),
            &broker,
        );
        let entries = topic_entries(&set, &broker, None);
        assert_eq!(entries.len(), TOPIC_CONFIGS.len());
        let get = |n: &str| entries.iter().find(|e| e.name == n).unwrap();
        assert_eq!(get("retention.ms").value, "5");
        assert_eq!(get("retention.ms").source, SOURCE_TOPIC);
        assert_eq!(get("segment.bytes").source, SOURCE_TOPIC);
        assert_eq!(
            get("segment.bytes").synonyms,
            vec![
                ("segment.bytes", "1048576".to_string(), SOURCE_TOPIC),
                (
                    "log.segment.bytes",
                    "268435456".to_string(),
                    SOURCE_STATIC_BROKER
                ),
                (
                    "log.segment.bytes",
                    "1073741824".to_string(),
                    SOURCE_DEFAULT
                )
            ]
        );
        assert_eq!(get("max.message.bytes").source, SOURCE_DEFAULT);
        assert_eq!(get("max.message.bytes").value, "1048588");
        let keys: BTreeSet<String> = ["retention.ms".to_string()].into();
        assert_eq!(topic_entries(&set, &broker, Some(&keys)).len(), 1);
    }

    #[test]
    fn topic_names_follow_kafka_rules() {
        assert!(invalid_topic_name("orders.v1_x-y").is_none());
        assert!(invalid_topic_name(&"x".repeat(249)).is_none());
        for bad in ["", ".", "..", "a b", "ä", "a/b", &"x".repeat(250)] {
            assert!(invalid_topic_name(bad).is_some(), "{bad:?} accepted");
        }
    }
}
