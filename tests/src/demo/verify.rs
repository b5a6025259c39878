//! The verification (module doc of [`super`], step 5): input, acknowledgements, the gateway's
//! log and the sink compared, with the serial line's losses explained by the gateway kill.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::time::Duration;

use super::publisher::Publisher;
use super::scenario::MqttRun;
use super::series::{CgmSeries, SstSeries};
use super::sink::{SinkLine, read_sink};
use super::summary::{Summary, TopicRow, thousands};
use super::{LINGER_MS, TOPIC_SST, TOPIC_SST_MQTT};
use crate::client::OwnedRecord;

/// How the stored buoy records compare with the lines sent.
#[derive(Debug, Default)]
pub(super) struct LineAccount {
    /// Sent lines found in the log, once each.
    pub(super) matched: u64,
    /// Indexes of sent lines not in the log.
    pub(super) missing: Vec<usize>,
    /// Stored payloads that are no sent line, with the index of the line they are the end
    /// of (if any).
    pub(super) fragments: Vec<(String, Option<usize>)>,
    /// Sent lines stored more than once.
    pub(super) repeated: u64,
}

pub(super) fn account_lines(sent: &[String], stored: &[&[u8]]) -> LineAccount {
    let mut index: HashMap<&[u8], Vec<usize>> = HashMap::new();
    for (i, l) in sent.iter().enumerate() {
        index.entry(l.as_bytes()).or_default().push(i);
    }
    let mut acc = LineAccount::default();
    let mut seen = vec![false; sent.len()];
    let mut ptr = 0usize;
    for p in stored {
        let candidates = index.get(p);
        match candidates.and_then(|v| v.iter().copied().find(|&j| !seen[j])) {
            Some(j) => {
                seen[j] = true;
                acc.matched += 1;
                ptr = ptr.max(j + 1);
            }
            None if candidates.is_some() => acc.repeated += 1,
            None => {
                let text = String::from_utf8_lossy(p).into_owned();
                // A line cut by the kill: the end of a line just before the current one.
                let of = (ptr.saturating_sub(3)..(ptr + 3).min(sent.len()))
                    .find(|&j| !seen[j] && !p.is_empty() && sent[j].as_bytes().ends_with(p));
                acc.fragments.push((text, of));
            }
        }
    }
    acc.missing = (0..sent.len()).filter(|&j| !seen[j]).collect();
    acc
}

/// Contiguous runs of sorted indexes, as (first, last).
pub(super) fn runs(idx: &[usize]) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for &i in idx {
        match out.last_mut() {
            Some((_, last)) if *last + 1 == i => *last = i,
            _ => out.push((i, i)),
        }
    }
    out
}

/// Everything [`verify`] needs.
pub(super) struct Observed<'a> {
    pub(super) sst: &'a SstSeries,
    pub(super) cgm: &'a CgmSeries,
    pub(super) sent_at: &'a [Duration],
    pub(super) killed_at: Duration,
    pub(super) back_at: Duration,
    pub(super) publishers: [&'a Publisher; 2],
    pub(super) log_id: u128,
    pub(super) first_offset: u64,
    pub(super) records: &'a [OwnedRecord],
    pub(super) sink_dir: &'a Path,
    pub(super) mqtt: &'a MqttRun,
}

/// Compares input, acknowledgements, the gateway's log and the sink (module doc, step 5).
pub(super) fn verify(o: &Observed<'_>, summary: &mut Summary) {
    let failures = &mut summary.failures;
    let notes = &mut summary.notes;
    let log_hex = format!("{:032x}", o.log_id);

    // The sink: exactly once per (log id, offset), in offset order per topic.
    let sink = read_sink(o.sink_dir, failures);
    let mut by_offset: HashMap<u64, &SinkLine> = HashMap::new();
    let mut dup_lines: HashMap<&str, u64> = HashMap::new();
    let mut foreign = 0u64;
    for (stem, lines) in &sink {
        let mut high: Option<u64> = None;
        for l in lines {
            if l.log_id != log_hex {
                foreign += 1;
                continue;
            }
            if let Some(first) = by_offset.get(&l.offset) {
                *dup_lines.entry(l.topic.as_str()).or_default() += 1;
                if first.payload != l.payload || first.topic != l.topic {
                    failures.push(format!(
                        "offset {} is in the sink twice with different contents",
                        l.offset
                    ));
                }
                continue;
            }
            if high.is_some_and(|h| l.offset < h) {
                failures.push(format!(
                    "sink files of {stem}: offset {} after {} (out of order)",
                    l.offset,
                    high.unwrap_or(0)
                ));
            }
            high = Some(high.map_or(l.offset, |h| h.max(l.offset)));
            by_offset.insert(l.offset, l);
        }
    }
    if foreign > 0 {
        failures.push(format!(
            "{foreign} sink lines carry another log id than {log_hex}"
        ));
    }

    // The gateway's log against the sink.
    let mut lost_stored: HashMap<&str, u64> = HashMap::new();
    let mut stored: HashMap<&str, u64> = HashMap::new();
    let mut gw_offsets: BTreeSet<u64> = BTreeSet::new();
    let mut mismatched = 0u64;
    for r in o.records {
        *stored.entry(r.topic.as_str()).or_default() += 1;
        gw_offsets.insert(r.offset);
        match by_offset.get(&r.offset) {
            None => *lost_stored.entry(r.topic.as_str()).or_default() += 1,
            Some(l) => {
                if l.topic != r.topic || l.payload != r.payload || l.timestamp_us != r.timestamp_us
                {
                    mismatched += 1;
                }
            }
        }
    }
    if mismatched > 0 {
        failures.push(format!(
            "{mismatched} sink lines differ from the gateway's record at their offset"
        ));
    }
    let phantom = by_offset
        .keys()
        .filter(|&&off| off >= o.first_offset && !gw_offsets.contains(&off))
        .count();
    if phantom > 0 {
        failures.push(format!(
            "{phantom} sink lines have an offset the gateway's log does not"
        ));
    }
    if o.first_offset > 0 {
        notes.push(format!(
            "the gateway had reclaimed offsets below {} (drained and committed); those are \
             checked against the acknowledgements only",
            o.first_offset
        ));
    }
    let delivered = |topic: &str| by_offset.values().filter(|l| l.topic == topic).count() as u64;

    // The serial line.
    let sent = o.sent_at.len();
    let sst_sent = &o.sst.lines[..sent];
    let sst_stored: Vec<&[u8]> = o
        .records
        .iter()
        .filter(|r| r.topic == TOPIC_SST)
        .map(|r| &r.payload[..])
        .collect();
    let acc = account_lines(sst_sent, &sst_stored);
    let mut sst_row = TopicRow {
        topic: TOPIC_SST.into(),
        path: "serial lines",
        input_rows: o.sst.lines.len() as u64 + o.sst.empty,
        skipped_empty: o.sst.empty,
        sent: sent as u64,
        resent: 0,
        acked: None,
        duplicate_acks: 0,
        stored: stored.get(TOPIC_SST).copied().unwrap_or(0),
        delivered: delivered(TOPIC_SST),
        duplicate_lines: dup_lines.get(TOPIC_SST).copied().unwrap_or(0),
        lost: lost_stored.get(TOPIC_SST).copied().unwrap_or(0),
    };
    if sent < o.sst.lines.len() {
        failures.push(format!(
            "only {sent} of {} buoy lines were written to the serial line",
            o.sst.lines.len()
        ));
    }
    if acc.repeated > 0 {
        failures.push(format!("{} buoy lines are stored twice", acc.repeated));
    }
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let window = Duration::from_millis(LINGER_MS) + Duration::from_secs(2);
    let mut unexplained = Vec::new();
    for (a, b) in runs(&acc.missing) {
        let (ta, tb) = (o.sent_at[a], o.sent_at[b]);
        if ta + window < o.killed_at || tb > o.killed_at {
            unexplained.push(format!(
                "lines {}..={} (sent at {:.1}..{:.1} s)",
                a + 1,
                b + 1,
                ta.as_secs_f64(),
                tb.as_secs_f64()
            ));
        }
    }
    let missing: BTreeSet<usize> = acc.missing.iter().copied().collect();
    let (during_down, during_down_stored) = o
        .sent_at
        .iter()
        .enumerate()
        .filter(|(_, t)| **t >= o.killed_at && **t <= o.back_at)
        .fold((0u64, 0u64), |(n, k), (i, _)| {
            (n + 1, k + u64::from(!missing.contains(&i)))
        });
    let mut sst_note = format!(
        "{TOPIC_SST}: {} lines written to the serial line, {} stored as written",
        thousands(sent as u64),
        thousands(acc.matched)
    );
    if !acc.missing.is_empty() {
        let first = acc.missing[0];
        let last = acc.missing[acc.missing.len() - 1];
        sst_note.push_str(&format!(
            "; {} not stored (lines {}..={}, written {:.0} to {:.0} ms before the gateway's \
             SIGKILL): line mode has no acknowledgements, and with --ack buffered the gateway \
             holds lines in RAM for up to --linger-ms {LINGER_MS} before writing them to flash, \
             so the lines it had read but not yet written died with it",
            thousands(acc.missing.len() as u64),
            first + 1,
            last + 1,
            ms(o.killed_at.saturating_sub(o.sent_at[first])),
            ms(o.killed_at.saturating_sub(o.sent_at[last])),
        ));
    }
    for (frag, of) in &acc.fragments {
        match of {
            Some(j) => sst_note.push_str(&format!(
                "; 1 record {frag:?} is the end of line {} ({:?}), cut in half by the kill: \
                 the killed gateway had read its first bytes, the restarted one read the rest",
                j + 1,
                o.sst.lines[*j]
            )),
            None => sst_note.push_str(&format!("; 1 record {frag:?} matches no line sent")),
        }
    }
    sst_note.push_str(&format!(
        "; of the {} lines written while the gateway was down, {} waited in the pty and were \
         stored after the restart",
        thousands(during_down),
        thousands(during_down_stored)
    ));
    notes.push(sst_note);
    if !unexplained.is_empty() {
        failures.push(format!(
            "buoy lines lost away from the gateway kill: {}",
            unexplained.join(", ")
        ));
    }
    let unmatched_fragments = acc.fragments.iter().filter(|f| f.1.is_none()).count();
    if acc.fragments.len() > 1 || unmatched_fragments > 0 {
        failures.push(format!(
            "{} stored buoy records are not lines that were sent",
            acc.fragments.len()
        ));
    }
    let expect_sst = acc.matched + acc.fragments.len() as u64;
    if sst_row.delivered != expect_sst {
        failures.push(format!(
            "{TOPIC_SST}: {} delivered, expected {} (sent {} − {} lost at the kill + {} fragments)",
            sst_row.delivered,
            expect_sst,
            sent,
            acc.missing.len(),
            acc.fragments.len()
        ));
    }
    sst_row.lost = lost_stored.get(TOPIC_SST).copied().unwrap_or(0);
    summary.topics.push(sst_row);

    // The TCP publishers.
    let gw_by_offset: HashMap<u64, &OwnedRecord> =
        o.records.iter().map(|r| (r.offset, r)).collect();
    let mut resent_total = 0;
    let mut dup_total = 0;
    for (p, empty) in o
        .publishers
        .iter()
        .zip([o.cgm.isig_empty, o.cgm.glucose_empty])
    {
        let st = p.lock();
        let topic = p.topic.as_str();
        let mut lost = 0u64;
        let mut wrong_offset = 0u64;
        for (r, a) in p.records.iter().zip(&st.acks) {
            let Some(a) = a else { continue };
            if let Some(g) = gw_by_offset.get(&a.offset)
                && (g.producer != Some(r.producer) || g.payload != r.payload)
            {
                wrong_offset += 1;
            }
            let ok = by_offset.get(&a.offset).is_some_and(|l| {
                l.topic == topic && l.payload == r.payload && l.timestamp_us == r.timestamp_us
            });
            if !ok {
                lost += 1;
            }
        }
        if wrong_offset > 0 {
            failures.push(format!(
                "{topic}: {wrong_offset} acknowledgements name an offset holding another record"
            ));
        }
        let mut producers: HashMap<(u64, u32), u64> = HashMap::new();
        for g in o.records.iter().filter(|g| g.topic == topic) {
            if let Some(pr) = g.producer {
                *producers.entry((pr.id, pr.seq)).or_default() += 1;
            }
        }
        let twice = producers.values().filter(|&&c| c > 1).count();
        if twice > 0 {
            failures.push(format!(
                "{topic}: {twice} (producer id, sequence) pairs are stored more than once"
            ));
        }
        let row = TopicRow {
            topic: topic.to_string(),
            path: "TCP durable",
            input_rows: o.cgm.rows as u64,
            skipped_empty: empty,
            sent: st.next as u64,
            resent: st.resent,
            acked: Some(st.acked as u64),
            duplicate_acks: st.duplicate_acks,
            stored: stored.get(topic).copied().unwrap_or(0),
            delivered: delivered(topic),
            duplicate_lines: dup_lines.get(topic).copied().unwrap_or(0),
            lost: lost + lost_stored.get(topic).copied().unwrap_or(0),
        };
        let expect = row.input_rows - row.skipped_empty;
        if row.acked != Some(expect) || row.delivered != expect || row.stored != expect {
            failures.push(format!(
                "{topic}: {expect} values in the input, {} acknowledged, {} stored, {} delivered",
                row.acked.unwrap_or(0),
                row.stored,
                row.delivered
            ));
        }
        if empty > 0 {
            notes.push(format!(
                "{topic}: {} of {} rows have no value (`nil` in the file) and were not sent; \
                 the other {} are each stored and delivered once",
                thousands(empty),
                thousands(row.input_rows),
                thousands(expect)
            ));
        }
        if st.storage_failures > 0 {
            notes.push(format!(
                "{topic}: the gateway answered {} durable publishes with StorageFailed; \
                 they were resent after it recovered",
                thousands(st.storage_failures)
            ));
        }
        resent_total += st.resent;
        dup_total += st.duplicate_acks;
        summary.topics.push(row);
    }
    if resent_total == 0 {
        notes.push(
            "TCP: the acknowledgements of every publish sent before the gateway's SIGKILL had \
             arrived before the connection dropped, so nothing needed resending this time; \
             the publishers reconnected to the restarted gateway and went on"
                .to_string(),
        );
    } else {
        notes.push(format!(
            "TCP: {} publishes had no acknowledgement when the gateway was SIGKILLed and were \
             resent after its restart with the same producer id and sequence number: {} had \
             reached flash before the kill and came back as duplicate acknowledgements with \
             their original offsets (not stored twice), {} were stored then",
            thousands(resent_total),
            thousands(dup_total),
            thousands(resent_total.saturating_sub(dup_total))
        ));
    }
    // The MQTT sensor: every reading acknowledged, stored once and delivered once.
    // One client, one connection: its messages must be in the log in the order sent.
    let m = o.mqtt;
    let mut mqtt_lines: Vec<&SinkLine> = by_offset
        .values()
        .copied()
        .filter(|l| l.topic == TOPIC_SST_MQTT)
        .collect();
    mqtt_lines.sort_by_key(|l| l.offset);
    let in_sink: HashMap<&[u8], u64> = mqtt_lines.iter().fold(HashMap::new(), |mut acc, l| {
        *acc.entry(l.payload.as_slice()).or_default() += 1;
        acc
    });
    let missing = m
        .sent
        .iter()
        .filter(|l| !in_sink.contains_key(l.as_bytes()))
        .count() as u64;
    let twice = in_sink.values().filter(|&&c| c > 1).count();
    if twice > 0 {
        failures.push(format!(
            "{TOPIC_SST_MQTT}: {twice} readings are stored more than once"
        ));
    }
    let out_of_order = mqtt_lines
        .iter()
        .zip(&m.sent)
        .position(|(l, s)| l.payload != s.as_bytes());
    if let Some(i) = out_of_order.filter(|_| missing == 0 && twice == 0) {
        failures.push(format!(
            "{TOPIC_SST_MQTT}: the record at offset {} is not reading {} as published \
             (out of order)",
            mqtt_lines[i].offset,
            i + 1
        ));
    }
    let mqtt_row = TopicRow {
        topic: TOPIC_SST_MQTT.into(),
        path: "MQTT QoS 1",
        input_rows: o.sst.lines.len() as u64 + o.sst.empty,
        skipped_empty: o.sst.empty,
        sent: m.sent.len() as u64,
        resent: 0,
        acked: Some(if m.acked { m.sent.len() as u64 } else { 0 }),
        duplicate_acks: 0,
        stored: stored.get(TOPIC_SST_MQTT).copied().unwrap_or(0),
        delivered: delivered(TOPIC_SST_MQTT),
        duplicate_lines: dup_lines.get(TOPIC_SST_MQTT).copied().unwrap_or(0),
        lost: if m.acked { missing } else { 0 }
            + lost_stored.get(TOPIC_SST_MQTT).copied().unwrap_or(0),
    };
    if !m.acked {
        failures.push(format!(
            "{TOPIC_SST_MQTT}: mosquitto_pub did not get every acknowledgement: {}",
            m.error.trim()
        ));
    }
    let n = m.sent.len() as u64;
    if mqtt_row.stored != n || mqtt_row.delivered != n {
        failures.push(format!(
            "{TOPIC_SST_MQTT}: {n} published, {} stored, {} delivered",
            mqtt_row.stored, mqtt_row.delivered
        ));
    }
    notes.push(format!(
        "{TOPIC_SST_MQTT}: after the replay an MQTT sensor (mosquitto_pub -q 1) published the \
         {} buoy readings once more in {} ms; the gateway sent each PUBACK once the record \
         was durable, and the sink holds them once each, in the order published",
        thousands(n),
        m.took.as_millis()
    ));
    summary.topics.push(mqtt_row);
    let dup_lines_total: u64 = dup_lines.values().sum();
    for t in &summary.topics {
        if t.lost > 0 {
            failures.push(format!("{}: {} records lost", t.topic, t.lost));
        }
    }
    if dup_lines_total > 0 {
        failures.push(format!(
            "{dup_lines_total} records are in the sink more than once"
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_account_finds_lost_lines_and_fragments() {
        let sent: Vec<String> = (0..10)
            .map(|i| format!("2016-01-01T00:0{i}:00Z,{i}.5"))
            .collect();
        let b = |i: usize| sent[i].as_bytes();
        // Lines 4 and 5 lost, the end of line 6 stored as a fragment, then the rest.
        let stored: Vec<&[u8]> = vec![b(0), b(1), b(2), b(3), b":00Z,6.5", b(7), b(8), b(9)];
        let acc = account_lines(&sent, &stored);
        assert_eq!(acc.matched, 7);
        assert_eq!(acc.missing, vec![4, 5, 6]);
        assert_eq!(acc.fragments, vec![(":00Z,6.5".to_string(), Some(6))]);
        assert_eq!(acc.repeated, 0);
        assert_eq!(runs(&acc.missing), vec![(4, 6)]);
        assert_eq!(runs(&[1, 2, 5, 7, 8]), vec![(1, 2), (5, 5), (7, 8)]);
        let twice = account_lines(&sent[..2], &[b(0), b(1), b(1)]);
        assert_eq!(twice.repeated, 1);
    }
}
