package io.stratalog.spark;

import java.util.Map;
import java.util.Set;

import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * {@code spark.read.format("stratalog-jvm")}: the batch read of {@code format("stratalog")}
 * with the records decoded on the JVM, so Spark's tasks never wait on a Python worker.
 *
 * <p>Planning stays in Python, in one place for both readers: the driver runs
 * {@code python -m stratalog.spark.jvm_plan}, which reads manifests and the coordinator
 * exactly as the Python reader does and answers with the slices as JSON ({@link Slice}).
 * Options, rows and errors are the Python reader's.
 */
public final class JvmSource implements TableProvider, DataSourceRegister {
  public static final String NAME = "stratalog-jvm";

  @Override
  public String shortName() {
    return NAME;
  }

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    return Rows.schema(Rows.includeHeaders(options));
  }

  @Override
  public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
    return new TopicTable(schema);
  }

  /** A topic as Spark's catalog sees it: readable in batch, nothing else. */
  static final class TopicTable implements SupportsRead {
    private final StructType schema;

    TopicTable(StructType schema) {
      this.schema = schema;
    }

    @Override
    public String name() {
      return NAME;
    }

    @Override
    @SuppressWarnings("deprecation")  // columns() is derived from it; Spark 4.0 has no other way
    public StructType schema() {
      return schema;
    }

    @Override
    public Set<TableCapability> capabilities() {
      return Set.of(TableCapability.BATCH_READ);
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
      return new TopicScan(schema, options);
    }
  }
}
