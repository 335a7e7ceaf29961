package io.stratalog.spark;

import java.io.IOException;
import java.io.OutputStream;
import java.io.Serializable;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;

import org.apache.spark.SparkConf;
import org.apache.spark.SparkEnv;

/**
 * The Python planner, run as {@code <python> -m stratalog.spark.jvm_plan}: a JSON request
 * on its stdin, a JSON answer on its stdout. One planner for both readers means one place
 * that knows manifests, the coordinator's WAL ranges, retention and transactions.
 */
public final class Planner implements Serializable {
  private static final long serialVersionUID = 1L;
  private static final ObjectMapper JSON = new ObjectMapper();
  private static volatile PlanService inProcess;

  private final String python;

  Planner(String python) {
    this.python = python;
  }

  /** Plans with {@code service} in this JVM from now on (null: a subprocess again). */
  public static void register(PlanService service) {
    inProcess = service;
  }

  /** The interpreter PySpark itself would use on this driver. */
  static Planner forDriver() {
    SparkEnv env = SparkEnv.get();
    SparkConf conf = env == null ? null : env.conf();
    String[] candidates = {
        conf == null ? null : conf.get("spark.pyspark.driver.python", null),
        conf == null ? null : conf.get("spark.pyspark.python", null),
        System.getenv("PYSPARK_DRIVER_PYTHON"),
        System.getenv("PYSPARK_PYTHON"),
    };
    for (String c : candidates) {
      if (c != null && !c.isEmpty()) {
        return new Planner(c);
      }
    }
    return new Planner("python3");
  }

  /** Every slice of a batch read with these options. */
  List<Slice> plan(Map<String, String> options) {
    ObjectNode request = JSON.createObjectNode();
    request.put("mode", "plan");
    request.set("options", JSON.valueToTree(options));
    return slices(call(request));
  }

  /**
   * The slices holding what is left of a WAL range whose object was collected (its
   * offsets sealed since), from {@code after + 1} on; {@code seekTs} still to be reached.
   */
  List<Slice> replan(Map<String, String> options, Slice gone, long after, Long seekTs) {
    ObjectNode request = JSON.createObjectNode();
    request.put("mode", "replan");
    request.set("options", JSON.valueToTree(options));
    try {
      request.set("slice", JSON.readTree(gone.replan));
    } catch (IOException e) {
      throw new IllegalStateException("unreadable re-plan of " + gone, e);
    }
    request.put("after", after);
    if (seekTs == null) {
      request.putNull("seek_ts");
    } else {
      request.put("seek_ts", seekTs);
    }
    return slices(call(request));
  }

  private static List<Slice> slices(JsonNode answer) {
    List<Slice> out = new ArrayList<>();
    for (JsonNode n : answer.get("slices")) {
      out.add(new Slice(n));
    }
    return out;
  }

  private JsonNode call(ObjectNode request) {
    PlanService service = inProcess;
    if (service != null) {
      String out;
      try {
        out = service.answer(JSON.writeValueAsString(request));
      } catch (IOException | RuntimeException e) {
        // The Python driver that registered it went away: plan in a process of our own.
        inProcess = null;
        return subprocess(request);
      }
      return checked(out.getBytes(StandardCharsets.UTF_8));
    }
    return subprocess(request);
  }

  private static JsonNode checked(byte[] out) {
    JsonNode answer;
    try {
      answer = JSON.readTree(out);
    } catch (IOException e) {
      throw new IllegalStateException("the Stratalog planner answered something that is not JSON: " + e, e);
    }
    if (answer.has("error")) {
      // The Python reader's own message (an option error, data loss, a corrupt object).
      throw new IllegalArgumentException(answer.get("error").asText());
    }
    return answer;
  }

  private JsonNode subprocess(ObjectNode request) {
    Path errors = null;
    try {
      errors = Files.createTempFile("stratalog-plan", ".err");
      ProcessBuilder pb = new ProcessBuilder(python, "-m", "stratalog.spark.jvm_plan");
      pb.redirectError(errors.toFile());
      Process p = pb.start();
      try (OutputStream in = p.getOutputStream()) {
        in.write(JSON.writeValueAsBytes(request));
      }
      byte[] out = p.getInputStream().readAllBytes();
      int rc = p.waitFor();
      if (rc != 0 || out.length == 0) {
        String err = new String(Files.readAllBytes(errors), StandardCharsets.UTF_8).strip();
        throw new IllegalStateException("the Stratalog planner (" + python
            + " -m stratalog.spark.jvm_plan) exited with " + rc + ": " + tail(err));
      }
      return checked(out);
    } catch (IOException e) {
      throw new IllegalStateException("cannot run the Stratalog planner with " + python
          + " (set spark.pyspark.python to the interpreter with stratalog installed): " + e, e);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException("interrupted while planning", e);
    } finally {
      if (errors != null) {
        try {
          Files.deleteIfExists(errors);
        } catch (IOException ignored) {
          // a temporary file left behind is harmless
        }
      }
    }
  }

  private static String tail(String text) {
    return text.length() <= 2000 ? text : "..." + text.substring(text.length() - 2000);
  }
}
