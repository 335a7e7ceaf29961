package io.stratalog.spark;

import com.fasterxml.jackson.databind.JsonNode;

import org.apache.spark.sql.connector.read.InputPartition;

/**
 * One unit of a read, as {@code stratalog.spark.jvm_plan} describes it: the bytes
 * {@code [byteStart, byteEnd)} of one object (a sealed segment's {@code .log} or a WAL
 * object), the offsets {@code [startOffset, endOffset)} kept from them, and the bounds
 * and aborted transactions the Python reader applies to the same slice.
 */
final class Slice implements InputPartition {
  private static final long serialVersionUID = 1L;

  final String topic;
  final int partition;
  final String key;
  /** {@code file:///...} or an {@code http(s)} URL the driver presigned. */
  final String location;
  final long byteStart;
  final long byteEnd;
  final long baseOffset;
  final long lastOffset;
  final long startOffset;
  final long endOffset;
  final Long seekTs;
  final Long stopTs;
  /** Per aborted transaction: producer id, first offset, abort marker offset. */
  final long[][] aborted;
  final boolean failOnDataLoss;
  final int chunkBytes;
  final int maxDecompressedBytes;
  /**
   * A WAL range's slice as the Python planner re-plans it if its object is gone; null for
   * a sealed segment's slice.
   */
  final String replan;

  Slice(JsonNode n) {
    topic = n.get("topic").asText();
    partition = n.get("partition").asInt();
    key = n.get("key").asText();
    location = n.get("location").asText();
    byteStart = n.get("byte_start").asLong();
    byteEnd = n.get("byte_end").asLong();
    baseOffset = n.get("base_offset").asLong();
    lastOffset = n.get("last_offset").asLong();
    startOffset = n.get("start_offset").asLong();
    endOffset = n.get("end_offset").asLong();
    seekTs = optionalLong(n, "seek_ts");
    stopTs = optionalLong(n, "stop_ts");
    JsonNode list = n.get("aborted");
    aborted = new long[list.size()][];
    for (int i = 0; i < aborted.length; i++) {
      JsonNode a = list.get(i);
      aborted[i] = new long[] {a.get(0).asLong(), a.get(1).asLong(), a.get(2).asLong()};
    }
    failOnDataLoss = n.get("fail_on_data_loss").asBoolean();
    chunkBytes = n.get("chunk_bytes").asInt();
    maxDecompressedBytes = n.get("max_decompressed_bytes").asInt();
    JsonNode again = n.get("replan");
    replan = again == null || again.isNull() ? null : again.toString();
  }

  private static Long optionalLong(JsonNode n, String field) {
    JsonNode v = n.get(field);
    return v == null || v.isNull() ? null : v.asLong();
  }

  @Override
  public String toString() {
    return topic + "-" + partition + " " + key + " [" + startOffset + ", " + endOffset + ")";
  }
}
