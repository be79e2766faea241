#!/bin/bash
set -e
printf "#!/bin/sh\necho ready\n" > run.sh
chmod u+x run.sh
