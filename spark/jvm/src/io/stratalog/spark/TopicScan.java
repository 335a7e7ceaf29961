package io.stratalog.spark;

import java.util.HashMap;
import java.util.List;
import java.util.Map;

import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * One batch read: the columns the query needs (only those are built), the slices the
 * Python planner names, and a reader per slice. Spark builds a new scan for every query,
 * so nothing of one query's plan is reused by the next.
 */
final class TopicScan implements ScanBuilder, SupportsPushDownRequiredColumns, Scan, Batch {
  private final Map<String, String> options;
  private final Planner planner = Planner.forDriver();
  private StructType required;
  private InputPartition[] planned;

  TopicScan(StructType schema, CaseInsensitiveStringMap options) {
    this.required = schema;
    this.options = new HashMap<>(options.asCaseSensitiveMap());
  }

  @Override
  public void pruneColumns(StructType requiredSchema) {
    required = requiredSchema;
  }

  @Override
  public Scan build() {
    return this;
  }

  @Override
  public StructType readSchema() {
    return required;
  }

  @Override
  public String description() {
    return JvmSource.NAME + " " + options.getOrDefault("topic", "") + " " + options.getOrDefault("path", "");
  }

  @Override
  public Batch toBatch() {
    return this;
  }

  @Override
  public InputPartition[] planInputPartitions() {
    // Spark may ask one scan more than once (BatchScanExec and adaptive execution each
    // do); a new query builds a new scan, so this never outlives its query.
    if (planned == null) {
      List<Slice> slices = planner.plan(options);
      planned = slices.toArray(new InputPartition[0]);
    }
    return planned;
  }

  @Override
  public PartitionReaderFactory createReaderFactory() {
    return new Factory(required.fieldNames(), options, planner);
  }

  /** Shipped to executors: what each slice reader needs besides its slice. */
  static final class Factory implements PartitionReaderFactory {
    private static final long serialVersionUID = 1L;
    private final String[] columns;
    private final HashMap<String, String> options;
    private final Planner planner;

    Factory(String[] columns, Map<String, String> options, Planner planner) {
      this.columns = columns;
      this.options = new HashMap<>(options);
      this.planner = planner;
    }

    @Override
    public PartitionReader<InternalRow> createReader(InputPartition partition) {
      return new SliceReader((Slice) partition, new Rows(columns), planner, options);
    }
  }
}
