package io.stratalog.spark;

import java.io.IOException;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

import org.apache.spark.sql.catalyst.InternalRow;

/**
 * What the JVM reader returns for slices the planner described, without Spark: reads
 * {@code {"python": ..., "options": {...}, "slices": [...]}} (slices as
 * {@code stratalog.spark.jvm_plan} answers) on stdin and prints one line per row,
 * {@code partition offset timestampMs value-as-hex} ({@code -} for a null value).
 * For looking at one slice by hand, and for tests that must let time pass between
 * planning and reading.
 */
public final class ReadSlices {
  private ReadSlices() {}

  public static void main(String[] args) throws IOException {
    JsonNode request = new ObjectMapper().readTree(System.in);
    Map<String, String> options = new HashMap<>();
    request.get("options").properties().forEach(e -> options.put(e.getKey(), e.getValue().asText()));
    Planner planner = new Planner(request.get("python").asText());
    Rows rows = new Rows(new String[] {"partition", "offset", "timestamp", "value"});
    PrintStream out = new PrintStream(System.out, false, StandardCharsets.UTF_8);
    for (JsonNode n : request.get("slices")) {
      try (SliceReader reader = new SliceReader(new Slice(n), rows, planner, options)) {
        while (reader.next()) {
          InternalRow row = reader.get();
          byte[] value = row.isNullAt(3) ? null : row.getBinary(3);
          out.println(row.getInt(0) + " " + row.getLong(1) + " " + row.getLong(2) / 1000 + " "
              + (value == null ? "-" : hex(value)));
        }
      }
    }
    out.flush();
  }

  private static String hex(byte[] bytes) {
    StringBuilder s = new StringBuilder(bytes.length * 2);
    for (byte b : bytes) {
      s.append(Character.forDigit((b >> 4) & 0xf, 16)).append(Character.forDigit(b & 0xf, 16));
    }
    return s.toString();
  }
}
