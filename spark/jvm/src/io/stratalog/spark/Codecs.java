package io.stratalog.spark;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.util.Arrays;
import java.util.zip.GZIPInputStream;

import com.github.luben.zstd.Zstd;
import com.github.luben.zstd.ZstdException;
import net.jpountz.lz4.LZ4FrameInputStream;
import org.xerial.snappy.Snappy;
import org.xerial.snappy.SnappyFramedInputStream;
import org.xerial.snappy.SnappyInputStream;

/**
 * The records sections of Kafka's codecs, read with the libraries Spark already ships.
 * Accepts what {@code stratalog.tiering.compression} accepts (concatenated gzip members
 * and frames; xerial, framed or bare snappy), and refuses a section that would
 * decompress past the limit, so a hostile batch cannot exhaust an executor.
 */
final class Codecs {
  static final int NONE = 0;
  static final int GZIP = 1;
  static final int SNAPPY = 2;
  static final int LZ4 = 3;
  static final int ZSTD = 4;
  private static final String[] NAMES = {"none", "gzip", "snappy", "lz4", "zstd"};
  private static final byte[] XERIAL = {(byte) 0x82, 'S', 'N', 'A', 'P', 'P', 'Y', 0};
  private static final byte[] FRAMED = {(byte) 0xff, 6, 0, 0, 's', 'N', 'a', 'P', 'p', 'Y'};

  private Codecs() {}

  /** Decompressed bytes: {@code bytes[0, length)}. */
  static final class Section {
    final byte[] bytes;
    final int length;

    Section(byte[] bytes, int length) {
      this.bytes = bytes;
      this.length = length;
    }
  }

  /**
   * The decompressed section, in {@code reuse} when it is large enough; {@link BadData}
   * for a malformed, truncated or oversized one.
   */
  static Section decompress(int codec, byte[] data, int from, int length, int limit, byte[] reuse) {
    if (codec < 1 || codec > 4) {
      throw new BadData("unknown compression codec " + codec);
    }
    String name = NAMES[codec];
    if (length == 0) {
      throw new BadData("empty " + name + " records section");
    }
    try {
      ByteArrayInputStream raw = new ByteArrayInputStream(data, from, length);
      // Records compress a few times over: start near the likely size, grow if needed.
      int guess = (int) Math.min(limit + 1L, Math.max(64 << 10, 4L * length));
      switch (codec) {
        case GZIP:
          return drain(new GZIPInputStream(raw, 64 << 10), buffer(reuse, guess), limit);
        case SNAPPY:
          if (startsWith(data, from, length, XERIAL)) {
            return drain(new SnappyInputStream(raw), buffer(reuse, guess), limit);
          }
          if (startsWith(data, from, length, FRAMED)) {
            return drain(new SnappyFramedInputStream(raw), buffer(reuse, guess), limit);
          }
          byte[] block = Arrays.copyOfRange(data, from, from + length);
          if (Snappy.uncompressedLength(block) > limit) {
            throw tooLarge(limit);
          }
          byte[] plain = Snappy.uncompress(block);
          return new Section(plain, plain.length);
        case LZ4:
          return drain(new LZ4FrameInputStream(raw), buffer(reuse, guess), limit);
        default:
          return zstd(data, from, length, buffer(reuse, guess), limit);
      }
    } catch (IOException | RuntimeException e) {
      if (e instanceof BadData) {
        throw (BadData) e;
      }
      throw new BadData("cannot decompress " + name + " records: " + e.getMessage());
    }
  }

  private static boolean startsWith(byte[] data, int from, int length, byte[] magic) {
    return length >= magic.length && Arrays.equals(data, from, from + magic.length, magic, 0, magic.length);
  }

  /**
   * Every frame of the section decompressed in one call (no stream buffers, one native
   * call per batch); an output array found too small is doubled, up to the limit.
   */
  private static Section zstd(byte[] data, int from, int length, byte[] out, int limit) {
    long stated = Zstd.getFrameContentSize(data, from, length);
    if (stated > limit) {
      throw tooLarge(limit);
    }
    if (stated > out.length) {
      out = new byte[(int) stated];
    }
    while (true) {
      try {
        long n = Zstd.decompressByteArray(out, 0, out.length, data, from, length);
        if (n > limit) {
          throw tooLarge(limit);
        }
        return new Section(out, (int) n);
      } catch (ZstdException e) {
        if (e.getErrorCode() != Zstd.errDstSizeTooSmall()) {
          throw new BadData("cannot decompress zstd records: " + e.getMessage());
        }
      }
      if (out.length > limit) {
        throw tooLarge(limit);
      }
      out = new byte[(int) Math.min(limit + 1L, 2L * out.length)];
    }
  }

  private static BadData tooLarge(int limit) {
    return new BadData("records decompress to more than " + limit + " bytes");
  }

  private static byte[] buffer(byte[] reuse, int guess) {
    return reuse != null && reuse.length >= guess ? reuse : new byte[guess];
  }

  private static Section drain(InputStream in, byte[] buffer, int limit) throws IOException {
    try (InputStream stream = in) {
      byte[] out = buffer;
      int n = 0;
      while (true) {
        if (n == out.length) {
          if (out.length > limit) {
            throw tooLarge(limit);
          }
          out = Arrays.copyOf(out, Math.min(out.length * 2, limit + 1));
        }
        int got = stream.read(out, n, out.length - n);
        if (got < 0) {
          return new Section(out, n);
        }
        n += got;
        if (n > limit) {
          throw tooLarge(limit);
        }
      }
    }
  }
}
