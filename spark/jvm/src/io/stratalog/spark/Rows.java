package io.stratalog.spark;

import java.util.Arrays;
import java.util.Locale;
import java.util.Map;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.codegen.UnsafeRowWriter;
import org.apache.spark.sql.catalyst.util.GenericArrayData;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * The Kafka source's row shape ({@code stratalog.spark.schema} describes it), built for
 * the columns a query asks for only.
 */
final class Rows {
  static final String[] ALL = {"key", "value", "topic", "partition", "offset", "timestamp",
      "timestampType", "headers"};
  private static final StructType HEADER = new StructType(new StructField[] {
      DataTypes.createStructField("key", DataTypes.StringType, true),
      DataTypes.createStructField("value", DataTypes.BinaryType, true)});

  static StructType schema(boolean includeHeaders) {
    StructField[] fields = {
        DataTypes.createStructField("key", DataTypes.BinaryType, true),
        DataTypes.createStructField("value", DataTypes.BinaryType, true),
        DataTypes.createStructField("topic", DataTypes.StringType, true),
        DataTypes.createStructField("partition", DataTypes.IntegerType, true),
        DataTypes.createStructField("offset", DataTypes.LongType, true),
        DataTypes.createStructField("timestamp", DataTypes.TimestampType, true),
        DataTypes.createStructField("timestampType", DataTypes.IntegerType, true),
        DataTypes.createStructField("headers", new ArrayType(HEADER, true), true)};
    StructType all = new StructType(fields);
    return includeHeaders ? all : new StructType(Arrays.copyOf(fields, 7));
  }

  /** The includeHeaders option as the Python reader reads it (true unless false/0/no). */
  static boolean includeHeaders(Map<String, String> options) {
    String v = null;
    for (Map.Entry<String, String> e : options.entrySet()) {
      if (e.getKey().equalsIgnoreCase("includeHeaders")) {
        v = e.getValue();
      }
    }
    if (v == null) {
      return true;
    }
    String s = v.trim().toLowerCase(Locale.ROOT);
    return !(s.equals("false") || s.equals("0") || s.equals("no"));
  }

  /** Per output column, its index in {@link #ALL}. */
  private final int[] fields;
  final boolean wantsHeaders;
  /** Rows without headers are written straight into one reused UnsafeRow. */
  private final UnsafeRowWriter writer;

  Rows(String[] columns) {
    fields = new int[columns.length];
    boolean h = false;
    for (int i = 0; i < columns.length; i++) {
      fields[i] = java.util.Arrays.asList(ALL).indexOf(columns[i]);
      h |= fields[i] == 7;
    }
    wantsHeaders = h;
    writer = h ? null : new UnsafeRowWriter(columns.length, 2048);
  }

  /**
   * One record's row: key and value are {@code rec[keyAt, keyAt + keyLen)} and
   * {@code rec[valueAt, valueAt + valueLen)}, null for a length of -1; {@code headers}
   * is null for a record without any. The row is valid until the next call.
   */
  InternalRow row(UTF8String topic, int partition, byte[] rec, int keyAt, int keyLen, int valueAt,
                  int valueLen, long offset, long timestampMs, int timestampType, GenericArrayData headers) {
    long micros = Math.multiplyExact(timestampMs, 1000L);
    if (writer == null) {
      Object[] out = new Object[fields.length];
      for (int i = 0; i < fields.length; i++) {
        switch (fields[i]) {
          case 0: out[i] = keyLen < 0 ? null : Arrays.copyOfRange(rec, keyAt, keyAt + keyLen); break;
          case 1: out[i] = valueLen < 0 ? null : Arrays.copyOfRange(rec, valueAt, valueAt + valueLen); break;
          case 2: out[i] = topic; break;
          case 3: out[i] = partition; break;
          case 4: out[i] = offset; break;
          case 5: out[i] = micros; break;
          case 6: out[i] = timestampType; break;
          default: out[i] = headers; break;
        }
      }
      return new GenericInternalRow(out);
    }
    writer.reset();
    writer.zeroOutNullBytes();
    for (int i = 0; i < fields.length; i++) {
      switch (fields[i]) {
        case 0: writeBytes(i, rec, keyAt, keyLen); break;
        case 1: writeBytes(i, rec, valueAt, valueLen); break;
        case 2: writer.write(i, topic); break;
        case 3: writer.write(i, partition); break;
        case 4: writer.write(i, offset); break;
        case 5: writer.write(i, micros); break;
        default: writer.write(i, timestampType); break;
      }
    }
    return writer.getRow();
  }

  /** {@code rec[at, at + length)} as column {@code i}, null for a length of -1. */
  private void writeBytes(int i, byte[] rec, int at, int length) {
    if (length < 0) {
      writer.setNullAt(i);
    } else {
      writer.write(i, rec, at, length);
    }
  }

  static GenericArrayData headers(Object[] pairs) {
    return new GenericArrayData(pairs);
  }

  static InternalRow header(UTF8String key, byte[] value) {
    return new GenericInternalRow(new Object[] {key, value});
  }
}
