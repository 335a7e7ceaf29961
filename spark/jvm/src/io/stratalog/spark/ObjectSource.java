package io.stratalog.spark;

import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.RandomAccessFile;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Arrays;

/**
 * Ranged reads of one object: a local file, or an object the driver presigned a GET for
 * (so the JVM needs no S3 credentials or SDK; any HTTP client can fetch a range).
 */
abstract class ObjectSource implements AutoCloseable {
  /** The object is absent: retention, compaction or WAL collection removed it. */
  static final class Gone extends RuntimeException {
    private static final long serialVersionUID = 1L;

    Gone(String key) {
      super(key);
    }
  }

  final String key;

  ObjectSource(String key) {
    this.key = key;
  }

  static ObjectSource open(String key, String location) {
    if (location.startsWith("file:")) {
      return new FileSource(key, Path.of(URI.create(location)));
    }
    return new HttpSource(key, URI.create(location));
  }

  /**
   * Bytes {@code [start, start + length)} into {@code dst} at {@code at}; how many there
   * were (fewer if the object ends first).
   */
  abstract int readInto(long start, byte[] dst, int at, int length);

  @Override
  public void close() {}

  static final class FileSource extends ObjectSource {
    private final Path path;
    private RandomAccessFile file;

    FileSource(String key, Path path) {
      super(key);
      this.path = path;
    }

    @Override
    int readInto(long start, byte[] dst, int at, int length) {
      try {
        if (file == null) {
          file = new RandomAccessFile(path.toFile(), "r");
        }
        long stop = Math.min(start + length, file.length());
        if (start >= stop) {
          return 0;
        }
        file.seek(start);
        file.readFully(dst, at, (int) (stop - start));
        return (int) (stop - start);
      } catch (FileNotFoundException e) {
        throw new Gone(key);
      } catch (IOException e) {
        throw new IllegalStateException("reading " + key + " at " + path + ": " + e, e);
      }
    }

    @Override
    public void close() {
      if (file != null) {
        try {
          file.close();
        } catch (IOException ignored) {
          // read-only: nothing to lose
        }
      }
    }
  }

  static final class HttpSource extends ObjectSource {
    private static final int ATTEMPTS = 6;
    private static final HttpClient CLIENT = HttpClient.newBuilder()
        .connectTimeout(Duration.ofSeconds(10))
        .version(HttpClient.Version.HTTP_1_1)
        .build();
    private final URI uri;

    HttpSource(String key, URI uri) {
      super(key);
      this.uri = uri;
    }

    @Override
    int readInto(long start, byte[] dst, int at, int length) {
      byte[] data = fetch(start, start + length);
      System.arraycopy(data, 0, dst, at, data.length);
      return data.length;
    }

    /** Bytes {@code [start, end)}, fewer if the object ends first. */
    private byte[] fetch(long start, long end) {
      if (start >= end) {
        return new byte[0];
      }
      HttpRequest request = HttpRequest.newBuilder(uri)
          .header("Range", "bytes=" + start + "-" + (end - 1))
          .timeout(Duration.ofSeconds(60))
          .GET().build();
      String last = "";
      for (int attempt = 1; attempt <= ATTEMPTS; attempt++) {
        try {
          HttpResponse<byte[]> r = CLIENT.send(request, HttpResponse.BodyHandlers.ofByteArray());
          int status = r.statusCode();
          if (status == 206) {
            return r.body();
          }
          if (status == 200) {  // the whole object: an endpoint that ignores ranges
            byte[] all = r.body();
            int from = (int) Math.min(start, all.length);
            return Arrays.copyOfRange(all, from, (int) Math.min(end, all.length));
          }
          if (status == 404) {
            throw new Gone(key);
          }
          if (status == 416) {
            return new byte[0];
          }
          last = "HTTP " + status + ": " + new String(r.body(), 0, Math.min(r.body().length, 300));
          if (status < 500 && status != 429) {
            break;  // a refusal (an expired presigned URL: 403) does not get better
          }
        } catch (IOException e) {
          last = e.toString();
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
          throw new IllegalStateException("interrupted reading " + key, e);
        }
        try {
          Thread.sleep(Math.min(2000L, 50L << attempt));
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
          throw new IllegalStateException("interrupted reading " + key, e);
        }
      }
      throw new IllegalStateException("GET " + key + " bytes " + start + "-" + (end - 1) + ": " + last);
    }
  }
}
