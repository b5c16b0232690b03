//! Kafka's topic config names for [`TopicConfig`]: every host turns `CreateTopics` and
//! `IncrementalAlterConfigs` entries into a `TopicConfig`, and describes one back, with the same
//! names, parsing and bounds as Kafka's `LogConfig`. One table here, so that hosts do not each
//! carry their own copy.

use crate::validate::{gzip_level_error, lz4_level_error, zstd_level_error};
use crate::{CleanupPolicy, CoordinatorError, TimestampType, TopicCompression, TopicConfig};

/// The Kafka topic configs a [`TopicConfig`] holds (the ones that take effect on a diskless
/// topic's data path), in Kafka's spelling.
pub const TOPIC_CONFIG_NAMES: &[&str] = &[
    "message.timestamp.type",
    "retention.ms",
    "retention.bytes",
    "max.message.bytes",
    "message.timestamp.before.max.ms",
    "message.timestamp.after.max.ms",
    "producer.id.expiration.ms",
    "segment.bytes",
    "segment.ms",
    "index.interval.bytes",
    "segment.index.bytes",
    "compression.type",
    "compression.gzip.level",
    "compression.lz4.level",
    "compression.zstd.level",
    "cleanup.policy",
    "delete.retention.ms",
    "min.compaction.lag.ms",
    "max.compaction.lag.ms",
    "min.cleanable.dirty.ratio",
];

impl TopicConfig {
    /// Sets the field named by Kafka config `name` from its text `value`, as Kafka parses it: longs
    /// and ints in decimal (an int above `i32::MAX` is refused), `message.timestamp.type` one of
    /// `CreateTime` / `LogAppendTime`, `retention.bytes` below `-1` read as `-1` (Kafka treats
    /// any negative size as "no limit"). Returns `Ok(false)` for a name that is not one of
    /// [`TOPIC_CONFIG_NAMES`] (the host keeps it as it likes); a value that does not parse or is
    /// out of Kafka's range is [`CoordinatorError::InvalidRequest`] naming the config, and leaves
    /// `self` unchanged.
    ///
    /// ```
    /// use diskless_coordinator::{CleanupPolicy, TimestampType, TopicConfig};
    /// let mut config = TopicConfig::default();
    /// assert!(config.set_kafka_config("retention.ms", "1000").unwrap());
    /// assert!(config.set_kafka_config("message.timestamp.type", "LogAppendTime").unwrap());
    /// assert!(config.set_kafka_config("cleanup.policy", "compact").unwrap());
    /// assert!(!config.set_kafka_config("flush.ms", "1000").unwrap());
    /// assert!(config.set_kafka_config("segment.bytes", "13").is_err());
    /// assert_eq!(config.retention_ms, 1000);
    /// assert_eq!(config.timestamp_type, TimestampType::LogAppendTime);
    /// assert_eq!(config.cleanup_policy, CleanupPolicy::Compact);
    /// assert_eq!(config.kafka_config_value("retention.ms").as_deref(), Some("1000"));
    /// ```
    pub fn set_kafka_config(&mut self, name: &str, value: &str) -> Result<bool, CoordinatorError> {
        let invalid = |why: &str| {
            CoordinatorError::InvalidRequest(format!(
                "invalid value {value:?} for configuration {name}: {why}"
            ))
        };
        let long = || {
            value
                .trim()
                .parse::<i64>()
                .map_err(|_| invalid("not a long"))
        };
        let int = || {
            value
                .trim()
                .parse::<i32>()
                .map_err(|_| invalid("not an int"))
        };
        let at_least_long = |min: i64| {
            long().and_then(|v| {
                if v >= min {
                    Ok(v)
                } else {
                    Err(invalid(&format!("value must be at least {min}")))
                }
            })
        };
        let at_least_int = |min: i32| {
            int().and_then(|v| {
                if v >= min {
                    Ok(v)
                } else {
                    Err(invalid(&format!("value must be at least {min}")))
                }
            })
        };
        match name {
            "message.timestamp.type" => {
                self.timestamp_type = match value {
                    "CreateTime" => TimestampType::CreateTime,
                    "LogAppendTime" => TimestampType::LogAppendTime,
                    _ => return Err(invalid("String must be one of: CreateTime, LogAppendTime")),
                }
            }
            "retention.ms" => self.retention_ms = at_least_long(-1)?,
            "retention.bytes" => self.retention_bytes = long()?.max(-1),
            "max.message.bytes" => self.max_message_bytes = at_least_int(0)?,
            "message.timestamp.before.max.ms" => {
                self.message_timestamp_before_max_ms = at_least_long(0)?
            }
            "message.timestamp.after.max.ms" => {
                self.message_timestamp_after_max_ms = at_least_long(0)?
            }
            "producer.id.expiration.ms" => self.producer_id_expiration_ms = at_least_long(1)?,
            "segment.bytes" => self.segment_bytes = at_least_int(14)?,
            "segment.ms" => self.segment_ms = at_least_long(1)?,
            "index.interval.bytes" => self.index_interval_bytes = at_least_int(0)?,
            "segment.index.bytes" => self.segment_index_bytes = at_least_int(4)?,
            "compression.type" => {
                self.compression_type = TopicCompression::from_name(value).ok_or_else(|| {
                    invalid(
                        "String must be one of: uncompressed, zstd, lz4, snappy, gzip, producer",
                    )
                })?
            }
            "compression.gzip.level" => {
                let level = int()?;
                if let Some(why) = gzip_level_error(level) {
                    return Err(invalid(why));
                }
                self.compression_gzip_level = level
            }
            "compression.lz4.level" => {
                let level = int()?;
                if let Some(why) = lz4_level_error(level) {
                    return Err(invalid(why));
                }
                self.compression_lz4_level = level
            }
            "compression.zstd.level" => {
                let level = int()?;
                if let Some(why) = zstd_level_error(level) {
                    return Err(invalid(why));
                }
                self.compression_zstd_level = level
            }
            "cleanup.policy" => {
                self.cleanup_policy = CleanupPolicy::from_name(value).ok_or_else(|| {
                    invalid("Invalid value for configuration cleanup.policy: each item must be one of [compact, delete]")
                })?
            }
            "delete.retention.ms" => self.delete_retention_ms = at_least_long(0)?,
            "min.compaction.lag.ms" => self.min_compaction_lag_ms = at_least_long(0)?,
            "max.compaction.lag.ms" => self.max_compaction_lag_ms = at_least_long(1)?,
            "min.cleanable.dirty.ratio" => {
                let ratio = value
                    .trim()
                    .parse::<f64>()
                    .map_err(|_| invalid("not a double"))?;
                if !(0.0..=1.0).contains(&ratio) {
                    return Err(invalid("Value must be between 0 and 1"));
                }
                self.min_cleanable_dirty_ratio = ratio
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// A `TopicConfig` from Kafka config entries: [`TopicConfig::default`] (or `base`'s values)
    /// with each entry of [`TOPIC_CONFIG_NAMES`] applied by [`TopicConfig::set_kafka_config`]; other
    /// names are skipped; an entry without a value (`None`, Kafka's "use the default") keeps the
    /// base value.
    pub fn from_kafka_configs<'a>(
        base: TopicConfig,
        entries: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
    ) -> Result<TopicConfig, CoordinatorError> {
        let mut config = base;
        for (name, value) in entries {
            if let Some(value) = value {
                config.set_kafka_config(name, value)?;
            }
        }
        config.validate()?;
        Ok(config)
    }

    /// The text of Kafka config `name` as Kafka describes it, for the names in
    /// [`TOPIC_CONFIG_NAMES`]; `None` for any other name.
    pub fn kafka_config_value(&self, name: &str) -> Option<String> {
        Some(match name {
            "message.timestamp.type" => match self.timestamp_type {
                TimestampType::CreateTime => "CreateTime".to_string(),
                TimestampType::LogAppendTime => "LogAppendTime".to_string(),
            },
            "retention.ms" => self.retention_ms.to_string(),
            "retention.bytes" => self.retention_bytes.to_string(),
            "max.message.bytes" => self.max_message_bytes.to_string(),
            "message.timestamp.before.max.ms" => self.message_timestamp_before_max_ms.to_string(),
            "message.timestamp.after.max.ms" => self.message_timestamp_after_max_ms.to_string(),
            "producer.id.expiration.ms" => self.producer_id_expiration_ms.to_string(),
            "segment.bytes" => self.segment_bytes.to_string(),
            "segment.ms" => self.segment_ms.to_string(),
            "index.interval.bytes" => self.index_interval_bytes.to_string(),
            "segment.index.bytes" => self.segment_index_bytes.to_string(),
            "compression.type" => self.compression_type.name().to_string(),
            "compression.gzip.level" => self.compression_gzip_level.to_string(),
            "compression.lz4.level" => self.compression_lz4_level.to_string(),
            "compression.zstd.level" => self.compression_zstd_level.to_string(),
            "cleanup.policy" => self.cleanup_policy.name().to_string(),
            "delete.retention.ms" => self.delete_retention_ms.to_string(),
            "min.compaction.lag.ms" => self.min_compaction_lag_ms.to_string(),
            "max.compaction.lag.ms" => self.max_compaction_lag_ms.to_string(),
            // Java's Double.toString for the values a ratio takes: "0.5", "0.01", "1.0".
            "min.cleanable.dirty.ratio" => java_double(self.min_cleanable_dirty_ratio),
            _ => return None,
        })
    }
}

/// `value` as Java's `Double.toString` writes a number in 0..=1: the shortest decimal that reads
/// back as the same double, with at least one digit after the point, and Java's computerized
/// scientific notation below 10^-3 (`1.0E-4`).
fn java_double(value: f64) -> String {
    if value != 0.0 && value.abs() < 1e-3 {
        let text = format!("{value:e}");
        let (mantissa, exponent) = text.split_once('e').unwrap_or((&text, "0"));
        let mantissa = if mantissa.contains('.') {
            mantissa.to_string()
        } else {
            format!("{mantissa}.0")
        };
        return format!("{mantissa}E{exponent}");
    }
    let text = format!("{value}");
    if text.contains('.') {
        text
    } else {
        format!("{text}.0")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_round_trips_through_its_text() {
        let mut changed = TopicConfig::default();
        let values = [
            ("message.timestamp.type", "LogAppendTime"),
            ("retention.ms", "-1"),
            ("retention.bytes", "1048576"),
            ("max.message.bytes", "2000000"),
            ("message.timestamp.before.max.ms", "5000"),
            ("message.timestamp.after.max.ms", "6000"),
            ("producer.id.expiration.ms", "70000"),
            ("segment.bytes", "1000000"),
            ("segment.ms", "80000"),
            ("index.interval.bytes", "100"),
            ("segment.index.bytes", "4096"),
            ("compression.type", "zstd"),
            ("compression.gzip.level", "9"),
            ("compression.lz4.level", "17"),
            ("compression.zstd.level", "-5"),
            ("cleanup.policy", "compact,delete"),
            ("delete.retention.ms", "0"),
            ("min.compaction.lag.ms", "1000"),
            ("max.compaction.lag.ms", "90000"),
            ("min.cleanable.dirty.ratio", "0.01"),
        ];
        assert_eq!(values.len(), TOPIC_CONFIG_NAMES.len());
        for (name, value) in values {
            assert!(TOPIC_CONFIG_NAMES.contains(&name));
            assert_eq!(changed.set_kafka_config(name, value).ok(), Some(true));
            assert_eq!(changed.kafka_config_value(name).as_deref(), Some(value));
        }
        assert_ne!(changed, TopicConfig::default());
        let rebuilt = TopicConfig::from_kafka_configs(
            TopicConfig::default(),
            values.iter().map(|(n, v)| (*n, Some(*v))),
        );
        assert_eq!(rebuilt.ok(), Some(changed));
    }

    #[test]
    fn out_of_range_and_malformed_values_are_refused_and_change_nothing() {
        let mut config = TopicConfig::default();
        for (name, value) in [
            ("retention.ms", "-2"),
            ("max.message.bytes", "-1"),
            ("max.message.bytes", "3000000000"),
            ("producer.id.expiration.ms", "0"),
            ("segment.bytes", "13"),
            ("segment.ms", "0"),
            ("segment.index.bytes", "3"),
            ("index.interval.bytes", "x"),
            ("message.timestamp.type", "createtime"),
            ("compression.type", "ZSTD"),
            ("compression.type", "brotli"),
            ("compression.gzip.level", "0"),
            ("compression.gzip.level", "10"),
            ("compression.lz4.level", "0"),
            ("compression.lz4.level", "18"),
            ("compression.zstd.level", "23"),
            ("compression.zstd.level", "-131073"),
            ("cleanup.policy", ""),
            ("cleanup.policy", "compact,shred"),
            ("cleanup.policy", "Compact"),
            ("delete.retention.ms", "-1"),
            ("min.compaction.lag.ms", "-1"),
            ("max.compaction.lag.ms", "0"),
            ("min.cleanable.dirty.ratio", "1.5"),
            ("min.cleanable.dirty.ratio", "-0.1"),
            ("min.cleanable.dirty.ratio", "NaN"),
            ("min.cleanable.dirty.ratio", "half"),
        ] {
            let err = config.set_kafka_config(name, value);
            assert!(
                matches!(&err, Err(CoordinatorError::InvalidRequest(m)) if m.contains(name)),
                "{name}={value}: {err:?}"
            );
        }
        assert_eq!(config, TopicConfig::default());
    }

    #[test]
    fn cleanup_policy_lists_and_ratios_read_back_as_kafka_writes_them() {
        let mut config = TopicConfig::default();
        for (list, described) in [
            ("delete", "delete"),
            ("compact", "compact"),
            ("delete,compact", "compact,delete"),
            (" compact , compact ", "compact"),
        ] {
            assert_eq!(
                config.set_kafka_config("cleanup.policy", list).ok(),
                Some(true)
            );
            assert_eq!(
                config.kafka_config_value("cleanup.policy").as_deref(),
                Some(described)
            );
        }
        for (ratio, described) in [
            ("0.5", "0.5"),
            ("1", "1.0"),
            ("0", "0.0"),
            ("0.0001", "1.0E-4"),
            ("0.25", "0.25"),
        ] {
            assert_eq!(
                config
                    .set_kafka_config("min.cleanable.dirty.ratio", ratio)
                    .ok(),
                Some(true)
            );
            assert_eq!(
                config
                    .kafka_config_value("min.cleanable.dirty.ratio")
                    .as_deref(),
                Some(described),
                "{ratio}"
            );
        }
    }

    #[test]
    fn min_compaction_lag_above_max_is_refused() {
        let err = TopicConfig::from_kafka_configs(
            TopicConfig::default(),
            [
                ("min.compaction.lag.ms", Some("2000")),
                ("max.compaction.lag.ms", Some("1000")),
            ],
        );
        assert!(
            matches!(&err, Err(CoordinatorError::InvalidRequest(m)) if m.contains("min.compaction.lag.ms")),
            "{err:?}"
        );
    }

    #[test]
    fn negative_retention_bytes_means_no_limit_and_unknown_names_are_skipped() {
        let mut config = TopicConfig::default();
        assert_eq!(
            config.set_kafka_config("retention.bytes", "-5").ok(),
            Some(true)
        );
        assert_eq!(config.retention_bytes, -1);
        assert_eq!(config.set_kafka_config("flush.ms", "5").ok(), Some(false));
        assert_eq!(config.kafka_config_value("flush.ms"), None);
        let kept = TopicConfig::from_kafka_configs(
            TopicConfig::default().with_retention_ms(5),
            [("retention.ms", None), ("diskless.enable", Some("true"))],
        );
        assert_eq!(kept.map(|c| c.retention_ms).ok(), Some(5));
    }
}
