// Deletion vectors read and written by Iceberg Java itself, for tests/interop/test_deletion_vectors_java.py.
// Compiled by that test against iceberg-core (and its dependencies) of the version under test.
//
//   DvTool read PUFFIN OUT_DIR
//     Parses PUFFIN's footer with Java's PuffinReader, prints one JSON line per blob (its metadata),
//     then reads each blob as Java's delete loader does (the bytes at the blob's offset and length,
//     PositionDeleteIndex.deserialize, which checks length, magic, CRC-32 and cardinality) and
//     writes its positions to OUT_DIR/<blob index>.pos as little-endian longs.
//
//   DvTool write PUFFIN DATA_FILE POS_FILE [DATA_FILE POS_FILE ...]
//     Writes one DV per data file (positions from POS_FILE, little-endian longs) with the calls
//     Java's BaseDVFileWriter makes (Deletes.toPositionIndex, PositionDeleteIndex.serialize, a
//     PuffinWriter with Java's blob metadata) and prints one JSON line per blob.

import java.io.RandomAccessFile;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import org.apache.iceberg.DeleteFile;
import org.apache.iceberg.FileFormat;
import org.apache.iceberg.FileMetadata;
import org.apache.iceberg.IcebergBuild;
import org.apache.iceberg.MetadataColumns;
import org.apache.iceberg.PartitionSpec;
import org.apache.iceberg.deletes.Deletes;
import org.apache.iceberg.deletes.PositionDeleteIndex;
import org.apache.iceberg.io.CloseableIterable;
import org.apache.iceberg.puffin.Blob;
import org.apache.iceberg.puffin.BlobMetadata;
import org.apache.iceberg.puffin.Puffin;
import org.apache.iceberg.puffin.PuffinReader;
import org.apache.iceberg.puffin.PuffinWriter;
import org.apache.iceberg.puffin.StandardBlobTypes;

public class DvTool {
  public static void main(String[] args) throws Exception {
    if (args.length >= 3 && args[0].equals("read")) {
      read(args[1], Path.of(args[2]));
    } else if (args.length >= 4 && args[0].equals("write") && args.length % 2 == 0) {
      write(args);
    } else {
      throw new IllegalArgumentException("usage: DvTool read PUFFIN OUT_DIR | write PUFFIN (DATA_FILE POS_FILE)+");
    }
  }

  private static void read(String puffin, Path outDir) throws Exception {
    long fileSize = Files.size(Path.of(puffin));
    List<BlobMetadata> blobs;
    try (PuffinReader reader = Puffin.read(org.apache.iceberg.Files.localInput(puffin)).build()) {
      blobs = reader.fileMetadata().blobs();
    }
    int index = 0;
    for (BlobMetadata blob : blobs) {
      String dataFile = blob.properties().get("referenced-data-file");
      long cardinality = Long.parseLong(blob.properties().get("cardinality"));
      DeleteFile dv =
          FileMetadata.deleteFileBuilder(PartitionSpec.unpartitioned())
              .ofPositionDeletes()
              .withFormat(FileFormat.PUFFIN)
              .withPath(puffin)
              .withFileSizeInBytes(fileSize)
              .withReferencedDataFile(dataFile)
              .withContentOffset(blob.offset())
              .withContentSizeInBytes(blob.length())
              .withRecordCount(cardinality)
              .build();
      byte[] bytes = new byte[(int) blob.length()];
      try (RandomAccessFile file = new RandomAccessFile(puffin, "r")) {
        file.seek(blob.offset());
        file.readFully(bytes);
      }
      PositionDeleteIndex positions = PositionDeleteIndex.deserialize(bytes, dv);
      ByteBuffer out = ByteBuffer.allocate((int) positions.cardinality() * 8).order(ByteOrder.LITTLE_ENDIAN);
      positions.forEach(out::putLong);
      Files.write(outDir.resolve(index + ".pos"), out.array());
      System.out.println(json(blob, positions.cardinality(), index));
      index++;
    }
  }

  private static void write(String[] args) throws Exception {
    try (PuffinWriter writer =
        Puffin.write(org.apache.iceberg.Files.localOutput(args[1])).createdBy(IcebergBuild.fullVersion()).build()) {
      for (int i = 2; i < args.length; i += 2) {
        ByteBuffer in = ByteBuffer.wrap(Files.readAllBytes(Path.of(args[i + 1]))).order(ByteOrder.LITTLE_ENDIAN);
        List<Long> longs = new ArrayList<>();
        while (in.hasRemaining()) {
          longs.add(in.getLong());
        }
        PositionDeleteIndex positions = Deletes.toPositionIndex(CloseableIterable.withNoopClose(longs));
        BlobMetadata blob =
            writer.write(
                new Blob(
                    StandardBlobTypes.DV_V1,
                    List.of(MetadataColumns.ROW_POSITION.fieldId()),
                    -1,
                    -1,
                    positions.serialize(),
                    null,
                    Map.of(
                        "referenced-data-file", args[i],
                        "cardinality", String.valueOf(positions.cardinality()))));
        System.out.println(json(blob, positions.cardinality(), (i - 2) / 2));
      }
    }
  }

  private static String json(BlobMetadata blob, long cardinality, int index) {
    StringBuilder props = new StringBuilder();
    for (Map.Entry<String, String> e : blob.properties().entrySet()) {
      props.append(props.length() == 0 ? "" : ",").append(quote(e.getKey())).append(':').append(quote(e.getValue()));
    }
    return String.format(
        "{\"index\":%d,\"type\":%s,\"fields\":%s,\"snapshot_id\":%d,\"sequence_number\":%d,\"offset\":%d,"
            + "\"length\":%d,\"compression_codec\":%s,\"properties\":{%s},\"cardinality\":%d}",
        index,
        quote(blob.type()),
        blob.inputFields(),
        blob.snapshotId(),
        blob.sequenceNumber(),
        blob.offset(),
        blob.length(),
        blob.compressionCodec() == null ? "null" : quote(blob.compressionCodec()),
        props,
        cardinality);
  }

  private static String quote(String s) {
    StringBuilder out = new StringBuilder("\"");
    for (char c : s.toCharArray()) {
      if (c == '"' || c == '\\') {
        out.append('\\').append(c);
      } else if (c < 0x20) {
        out.append(String.format("\\u%04x", (int) c));
      } else {
        out.append(c);
      }
    }
    return out.append('"').toString();
  }
}
